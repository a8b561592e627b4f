"""A grammar's token bitmask applied to CPU logits in C (`csrc/bitmask.c`): each 32-bit word read
once, whole words of allowed or banned tokens at a time. The worker hands `apply_bitmask` to the
torch sampler on CPU: torch's expansion of every word into 32 lanes takes ~2 ms a row at a 262k
vocabulary."""

from __future__ import annotations

import ctypes

import torch

from radixgen.runtime.kernels import ffi
from radixgen.sampling.torch_ops import apply_token_bitmask_, check_bitmask


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """In place: logits[b, t] = -inf where bit t % 32 of bitmask[b, t // 32] is 0, for logits [B, V] and
    bitmask int32 [B, W >= ceil(V / 32)], as `apply_token_bitmask_` (which takes other dtypes and
    devices). Returns logits."""
    lib = lib or ffi.library()
    b, v = logits.shape
    if (lib is None or logits.device.type != "cpu" or logits.dtype != torch.float32 or not logits.is_contiguous()
            or bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or b == 0):
        return apply_token_bitmask_(logits, bitmask)
    check_bitmask(logits, bitmask)
    words = bitmask.contiguous()
    if lib.apply_bitmask(logits.data_ptr(), words.data_ptr(), b, v, words.shape[1], ffi.kernel_threads()) != 0:
        raise RuntimeError("apply_bitmask failed")
    return logits
