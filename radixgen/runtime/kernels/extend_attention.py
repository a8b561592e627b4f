"""Prompt attention in bfloat16 in C for CPU (`csrc/extend_attention.c`): K/V read in place through
req_to_token, products on AVX512-BF16 dot products.

For long prompt chunks, whose GEMMs already run in bfloat16 (`EngineConfig.wide_matmul_dtype`): long
prefill is mostly attention, which torch's float32 flash attention runs at ~120 GFLOP/s on AMD Zen 4
(2 threads); this kernel runs 2.2-3.5x faster there. Each request's result depends on its own
lengths alone.
"""

from __future__ import annotations

import ctypes

import torch

from radixgen.runtime.kernels import ffi

KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_GROUP, MAX_HEAD_DIM = 16, 256  # the kernel's limits (csrc/extend_attention.c): query heads per KV head, D


def available(kv_dtype: torch.dtype, heads: int = 1, kv_heads: int = 1, head_dim: int = 64) -> bool:
    """Whether the native kernels have the bfloat16 prompt attention (AVX512-BF16) for this KV dtype and
    attention shape (head_dim a multiple of 16 up to 256, up to 16 query heads per KV head)."""
    if heads % kv_heads or heads // kv_heads > MAX_GROUP or head_dim % 16 or head_dim > MAX_HEAD_DIM:
        return False
    lib = ffi.library()
    return kv_dtype in KV_DTYPES and lib is not None and lib.extend_attention_bf16_available() == 1


def extend_attention_bf16(
    q: torch.Tensor,  # [T, H, D] the requests' new rows, one request after another
    k_buffer: torch.Tensor,  # [N, Hkv, D]
    v_buffer: torch.Tensor,  # [N, Hkv, D]
    req_to_token: torch.Tensor,  # [R, L] int64 KV slot of each request's tokens
    rows: torch.Tensor,  # [B] int64 row of each request in req_to_token
    prefix_lens: torch.Tensor,  # [B] int64 cached keys before each request's new rows
    extend_lens: torch.Tensor,  # [B] int64 new rows (and keys, already stored) of each request
    scale: float,
    window: int | None = None,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:  # [T, H * D] in q's dtype
    """Causal attention of each request's new queries over its prefix and its own new keys (with
    `window`: over the `window` latest keys up to each query, itself included), with queries, keys,
    values and softmax weights rounded to bfloat16 and float32 sums."""
    if window is not None and window < 1:
        raise ValueError(f"extend_attention_bf16: window must be a positive number of keys, got {window}")
    t, h, d = q.shape
    if k_buffer.dtype not in KV_DTYPES or v_buffer.dtype != k_buffer.dtype:
        raise ValueError(f"extend_attention_bf16: K/V must be float32, bfloat16 or float16, got "
                         f"{k_buffer.dtype}/{v_buffer.dtype}")
    if req_to_token.dtype != torch.int64 or not req_to_token.is_contiguous():
        raise ValueError("extend_attention_bf16: req_to_token must be a contiguous int64 table")
    if int(extend_lens.sum()) != t:
        raise ValueError(f"extend_attention_bf16: {t} query rows but the extends sum to {int(extend_lens.sum())}")
    lib = lib or ffi.library()
    # q's rows may be a strided view (the q part of fused qkv rows): read in place, not copied
    in_place = q.dtype == torch.float32 and q.stride(2) == 1 and q.stride(1) == d and q.stride(0) >= h * d
    qf = q if in_place else q.float().contiguous()
    out = torch.empty((t, h, d), dtype=torch.float32)
    rows, prefix_lens, extend_lens = rows.contiguous(), prefix_lens.contiguous(), extend_lens.contiguous()
    rc = -1 if lib is None else lib.extend_attention_bf16(
        qf.data_ptr(), qf.stride(0), k_buffer.data_ptr(), v_buffer.data_ptr(), ffi.kv_dtype_code(k_buffer.dtype),
        req_to_token.data_ptr(), req_to_token.shape[1], rows.data_ptr(), prefix_lens.data_ptr(),
        extend_lens.data_ptr(), rows.numel(), h, k_buffer.shape[1], d, window or 0, scale, out.data_ptr(),
        ffi.kernel_threads(),
    )
    if rc != 0:
        raise RuntimeError(f"extend_attention_bf16 failed (no AVX512-BF16 in this build, heads {h}/{k_buffer.shape[1]}"
                           f" or head size {d} unsupported, a sequence past {req_to_token.shape[1]} keys, or memory)")
    return out.view(t, h * d).to(q.dtype)
