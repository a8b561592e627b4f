"""Greedy sampling's argmax in C for CPU logits (`csrc/argmax.c`): each row cut into chunks the kernel
threads scan, for the vocabularies where torch's one-thread `max(-1).indices` is a visible share of a
decode step (Gemma's 262k tokens: ~0.25 ms of it)."""

from __future__ import annotations

import ctypes

import torch

from radixgen.runtime.kernels import ffi
from radixgen.sampling.torch_ops import greedy_tokens


def argmax_rows(logits: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:  # [B] int64
    """Each row's first largest value's position for logits [B, V]: the same index as torch's
    `max(-1).indices` (`greedy_tokens`) on non-NaN rows; other dtypes and devices go to torch."""
    lib = lib or ffi.library()
    if lib is None or logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2:
        return greedy_tokens(logits)
    x = logits.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.int64)
    if x.shape[0] == 0 or lib.argmax_rows(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr(),
                                           ffi.kernel_threads()) != 0:
        return greedy_tokens(logits)
    return out
