"""The int8 KV cache row format (`kv_cache_dtype="int8"`), shared by the KV pool and the C kernels.

Per token and KV head: D int8 values q and the float32 scale s = max|x| / 127 in the next 4 bytes
(a row of D + 4 bytes in an int8 tensor [N, Hkv, D + 4]); x ~= s * q with q = round(x / s), ties to
even. The C kernels (`runtime/kernels/csrc`, RG_KV_I8) write and read the same layout.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one KV head row in a buffer of `dtype`."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def quantize(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] float -> int8 rows [..., D + 4]."""
    x = x.float()
    scale = x.abs().amax(-1, keepdim=True) / 127  # [..., 1]
    q = torch.round(x / torch.where(scale == 0, torch.ones_like(scale), scale)).clamp_(-127, 127).to(torch.int8)
    return torch.cat([q, scale.contiguous().view(torch.int8)], -1)


def dequantize(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 rows [..., D + 4] -> [..., D] in `dtype`."""
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)  # [..., 1]
    return (rows[..., :-SCALE_BYTES].float() * scale).to(dtype)


def gather(buffer: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """buffer[index] (a KV buffer [N, Hkv, W]) as values [len(index), Hkv, D] in `dtype`."""
    rows = buffer.index_select(0, index)  # index_select: ~4x faster than advanced indexing on CPU
    return dequantize(rows, dtype) if buffer.dtype == torch.int8 else rows.to(dtype)
