"""Decode attention in C for CPU (`csrc/decode_attention.c`): K/V read in place through req_to_token.

The torch path gathers every decode request's K/V into a padded copy per layer and runs SDPA on it;
for decoding that is most of attention's time (SmolLM2, batch 16 at ~150 tokens: 0.26 ms of
gathers plus 0.4 ms of SDPA per layer). The C kernel reads each key and value once from the pool.
"""

from __future__ import annotations

import ctypes

import torch

from radixgen.runtime.kernels import ffi

KV_DTYPES = tuple(ffi.KV_DTYPE_CODES)  # float32, bfloat16, float16, int8 rows (radix_cache/kv_quant.py)


def available(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether decode attention can run in C for this KV device and dtype."""
    return device.type == "cpu" and dtype in KV_DTYPES and ffi.library() is not None


def decode_attention(
    q: torch.Tensor,  # [B, H, D]
    k_buffer: torch.Tensor,  # [N, Hkv, D] (int8 rows: [N, Hkv, D + 4])
    v_buffer: torch.Tensor,  # [N, Hkv, D]
    req_to_token: torch.Tensor,  # [R, L] int64 KV slot of each request's tokens
    rows: torch.Tensor,  # [B] int64 row of each request in req_to_token
    seq_lens: torch.Tensor,  # [B] int64 keys of each request (its new token included)
    scale: float,
    start: int = 0,
    return_lse: bool = False,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[B, H * D] in q's dtype: attention over each request's keys start .. seq_len. With
    `return_lse`: (out [B, H, D] float32, log-sum-exp of the scores [B, H] float32), to merge with
    attention over the first `start` keys. `lib`: the kernel library (default the native one;
    tests pass the scalar reference)."""
    b, h, d = q.shape
    h_kv = k_buffer.shape[1]
    if k_buffer.dtype not in KV_DTYPES or v_buffer.dtype != k_buffer.dtype:
        raise ValueError(f"decode_attention: K/V must be float32, bfloat16, float16 or int8 rows, got "
                         f"{k_buffer.dtype}/{v_buffer.dtype}")
    if req_to_token.dtype != torch.int64 or not req_to_token.is_contiguous():
        raise ValueError("decode_attention: req_to_token must be a contiguous int64 table")
    lib = lib or ffi.library()
    if lib is None:
        raise RuntimeError("decode_attention: the C kernel could not be built (see the log)")
    qf = q.float().contiguous()
    out = torch.empty((b, h, d), dtype=torch.float32)
    lse = torch.empty((b, h), dtype=torch.float32) if return_lse else None
    rows, seq_lens = rows.contiguous(), seq_lens.contiguous()
    rc = lib.decode_attention(
        qf.data_ptr(), k_buffer.data_ptr(), v_buffer.data_ptr(), ffi.kv_dtype_code(k_buffer.dtype),
        req_to_token.data_ptr(), req_to_token.shape[1], rows.data_ptr(), seq_lens.data_ptr(), start, b, h, h_kv, d,
        scale, out.data_ptr(), None if lse is None else lse.data_ptr(), ffi.kernel_threads(),
    )
    if rc != 0:
        raise RuntimeError(f"decode_attention failed (heads {h}/{h_kv}, or a sequence length outside "
                           f"{start + 1}..{req_to_token.shape[1]})")
    if lse is not None:
        return out, lse
    return out.view(b, h * d).to(q.dtype)


def shared_prefix_decode_attention(
    q: torch.Tensor,  # [B, H, D]
    k_buffer: torch.Tensor,  # [N, Hkv, D]
    v_buffer: torch.Tensor,  # [N, Hkv, D]
    req_to_token: torch.Tensor,  # [R, L] int64
    rows: torch.Tensor,  # [B] int64
    seq_lens: torch.Tensor,  # [B] int64
    shared: torch.Tensor,  # [C] int64 KV slots every request starts with
    scale: float,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:  # [B, H * D], q's dtype
    """Cascade decode attention: every request's queries against the shared prefix together (each
    shared key read once per 24 queries, outer products), the rest per request, merged by
    log-sum-exp. 16 decodes on a shared 1000-token prefix: the per-request kernel alone re-reads the
    prefix 16 times. int8 K/V: no cascade kernel; each request attends its whole sequence."""
    b, h, d = q.shape
    lib = lib or ffi.library()
    if k_buffer.dtype == torch.int8:
        return decode_attention(q, k_buffer, v_buffer, req_to_token, rows, seq_lens, scale, lib=lib)
    out, lse_own = decode_attention(q, k_buffer, v_buffer, req_to_token, rows, seq_lens, scale, start=shared.numel(),
                                    return_lse=True, lib=lib)  # [B, H, D], [B, H]
    shared, qf = shared.contiguous(), q.float().contiguous()  # held: the C call reads their memory
    rc = lib.shared_prefix_attention(
        qf.data_ptr(), k_buffer.data_ptr(), v_buffer.data_ptr(),
        ffi.kv_dtype_code(k_buffer.dtype), shared.data_ptr(), shared.numel(), b, h, k_buffer.shape[1], d, scale,
        out.data_ptr(), lse_own.data_ptr(), ffi.kernel_threads(),
    )
    if rc != 0:
        raise RuntimeError(f"shared_prefix_attention failed (heads {h}/{k_buffer.shape[1]}, head dim {d})")
    return out.view(b, h * d).to(q.dtype)
