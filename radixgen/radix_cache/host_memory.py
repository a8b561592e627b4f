"""Host buffers for the KV pool backed by transparent huge pages where Linux allows it.

A CPU KV pool is allocated untouched (a 65,536-slot SmolLM2 pool is 3 GiB), so the first write to
each 4 KiB page faults, and a page holds only ~5 tokens of one layer's K or V. Decoding 16 requests
that reach new slots faults ~180 pages a step; on this VM a fault costs ~15 us, which put rope_store
(the K/V store) at 2.8 ms of a 40 ms step. With `MADV_HUGEPAGE` a fault maps 2 MiB (~2,700 tokens of
one buffer): the same store takes 0.2 ms. Memory is still committed only as slots are first written,
2 MiB at a time per buffer.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

import torch

HUGE_PAGE = 2 << 20  # bytes (x86-64 / arm64 transparent huge page)
MADV_HUGEPAGE = 14  # <sys/mman.h>


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def empty_kv_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialised tensor like `torch.empty(shape, dtype=dtype, device=device)`; on Linux CPU its
    memory is 2 MiB-aligned and advised for huge pages (a plain `torch.empty` elsewhere, or if the
    kernel refuses the advice: the tensor works the same, only page faults cost more)."""
    device = torch.device(device)
    madvise = _madvise()
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if device.type != "cpu" or madvise is None or nbytes < HUGE_PAGE:
        return torch.empty(shape, dtype=dtype, device=device)
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)  # untouched: large allocations are fresh mmaps
    offset = -raw.data_ptr() % HUGE_PAGE
    span = (raw.numel() - offset) // HUGE_PAGE * HUGE_PAGE  # whole huge pages inside `raw`, >= nbytes rounded down
    madvise(raw.data_ptr() + offset, span, MADV_HUGEPAGE)  # advice only: a refusal changes speed, not results
    return raw[offset : offset + nbytes].view(dtype).view(shape)
