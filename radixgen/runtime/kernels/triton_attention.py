"""Triton attention over the token KV pool: the GPU twin of the torch backend's `attention` (same contract).

K/V are never copied into a dense tensor: every program reads its request's KV slots from the
`req_to_token` row and gathers K/V rows by slot inside the kernel. Keys past a request's end read
slot 0, the pool's padding slot, and are masked out.

* Extend (prefill, decode rows may be mixed in): FlashAttention-2 (Dao, 2023). A program owns
  BLOCK_M queries of one request and one head, streams that request's keys in BLOCK_N tiles with an
  online softmax, and stops at the causal limit of its last query.
* Decode: split-KV "flash-decoding" (Dao, Haziza, Massa, Sizov, 2023). Stage 1: a program per
  (request, KV head, split) takes the whole query-head group of its KV head (padded to 16 rows so
  `tl.dot` is legal) over one of `num_kv_splits` equal parts of the sequence and writes a partial
  output and its log-sum-exp; stage 2 merges the parts. Both grids depend only on the batch size, the
  head counts and `num_kv_splits` (split lengths are computed in-kernel), so a decode step can be
  captured in a CUDA graph.

Sliding-window layers pass `window` (`TritonAttentionMetadata.window`): a query sees the `window` latest
keys up to itself. The extend kernel starts at the first key its block's first query sees and masks
the rest; the decode kernel splits only the window's keys. Rows that see no key of a tile keep a
running max of -inf, so exponents are taken against 0 there (no NaN from -inf - -inf).

Softmax runs in base 2 (scores pre-multiplied by scale * log2(e)); every accumulation is fp32.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixgen.common.transfer import to_device
from radixgen.runtime.executor.forward_batch import ForwardBatch

_LOG2E = 1.4426950408889634
_NO_WINDOW = 1 << 30  # the window of global layers: more keys than any sequence holds


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b in fp32. UPCAST (interpreter, bf16 only): its dot multiplies bf16's raw uint16 bits."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _extend_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, req_to_token_ptr, req_idx_ptr, qo_start_ptr, prefix_ptr, extend_ptr,
    stride_qt, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_ot, stride_oh, stride_rt,
    qk_scale, D, WINDOW,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Program (request r, query head h, query block mb): BLOCK_M new queries against their causal keys
    (the WINDOW latest of them)."""
    r, h, mb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    extend = tl.load(extend_ptr + r)
    if mb * BLOCK_M >= extend:
        return
    prefix = tl.load(prefix_ptr + r)
    q_row0 = tl.load(qo_start_ptr + r)
    slots_ptr = req_to_token_ptr + tl.load(req_idx_ptr + r) * stride_rt
    kv_h = h // GROUP
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # [M] query index within the request
    offs_n = tl.arange(0, BLOCK_N)  # [N]
    offs_d = tl.arange(0, BLOCK_D)  # [BD]
    d_ok = offs_d < D
    q_mask = (offs_m < extend)[:, None] & d_ok[None, :]  # [M, BD]
    q = tl.load(q_ptr + (q_row0 + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=q_mask, other=0.0)  # [M, BD]
    q_pos = prefix + offs_m  # [M] position of each query in its sequence
    end = prefix + tl.minimum(extend, (mb + 1) * BLOCK_M)  # one past the last query's causal limit
    lo = tl.maximum(prefix + mb * BLOCK_M - WINDOW + 1, 0)  # the first key the block's first query sees

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, end, BLOCK_N):
        k_pos = start + offs_n  # [N]
        slot = tl.load(slots_ptr + k_pos, mask=k_pos < end, other=0).to(tl.int64)  # [N], 0 = padding
        k = tl.load(k_ptr + slot[:, None] * stride_kn + kv_h * stride_kh + offs_d[None, :],
                    mask=d_ok[None, :], other=0.0)  # [N, BD]
        s = _dot(q, tl.trans(k), PRECISION, UPCAST) * qk_scale  # [M, N]
        seen = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] > q_pos[:, None] - WINDOW)  # [M, N]
        s = tl.where(seen, s, float("-inf"))  # causal (implies k_pos < end), in the window
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [M]
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # [M] rows that saw no key yet: exp2(-inf) = 0
        p = tl.exp2(s - m_ref[:, None])  # [M, N]
        alpha = tl.exp2(m_i - m_ref)  # [M]
        v = tl.load(v_ptr + slot[:, None] * stride_vn + kv_h * stride_vh + offs_d[None, :],
                    mask=d_ok[None, :], other=0.0)  # [N, BD]
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / l_i[:, None]  # [M, BD]
    tl.store(o_ptr + (q_row0 + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, mid_o_ptr, mid_lse_ptr, req_to_token_ptr, req_idx_ptr, seq_lens_ptr,
    stride_qt, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_rt,
    qk_scale, H, D, WINDOW,
    GROUP: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Program (request r, KV head, split): the GROUP query heads of that KV head over one split of
    the keys it sees (the WINDOW latest)."""
    r, kv_h, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + r)
    first = tl.maximum(seq_len - WINDOW, 0)
    split_len = tl.cdiv(seq_len - first, NUM_SPLITS)
    lo = first + split * split_len
    hi = tl.minimum(lo + split_len, seq_len)
    if lo >= hi:  # empty split: stage 2 skips it
        return
    slots_ptr = req_to_token_ptr + tl.load(req_idx_ptr + r) * stride_rt
    offs_g = tl.arange(0, BLOCK_H)  # [BH] head within the group (rows >= GROUP are padding)
    heads = kv_h * GROUP + offs_g  # [BH]
    offs_n = tl.arange(0, BLOCK_N)  # [N]
    offs_d = tl.arange(0, BLOCK_D)  # [BD]
    d_ok = offs_d < D
    hd_mask = (offs_g < GROUP)[:, None] & d_ok[None, :]  # [BH, BD]
    q = tl.load(q_ptr + r * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=hd_mask, other=0.0)  # [BH, BD]

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):  # every tile has at least one real key
        k_pos = start + offs_n  # [N]
        n_ok = k_pos < hi
        slot = tl.load(slots_ptr + k_pos, mask=n_ok, other=0).to(tl.int64)  # [N], 0 = padding
        k = tl.load(k_ptr + slot[:, None] * stride_kn + kv_h * stride_kh + offs_d[None, :],
                    mask=d_ok[None, :], other=0.0)  # [N, BD]
        s = _dot(q, tl.trans(k), PRECISION, UPCAST) * qk_scale  # [BH, N]
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # [BH]
        p = tl.exp2(s - m_new[:, None])  # [BH, N]
        alpha = tl.exp2(m_i - m_new)  # [BH]
        v = tl.load(v_ptr + slot[:, None] * stride_vn + kv_h * stride_vh + offs_d[None, :],
                    mask=d_ok[None, :], other=0.0)  # [N, BD]
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    part = (r * H + heads) * NUM_SPLITS + split  # [BH] row of the [B, H, S] workspaces
    tl.store(mid_o_ptr + part[:, None] * D + offs_d[None, :], acc / l_i[:, None], mask=hd_mask)
    tl.store(mid_lse_ptr + part, m_i + tl.log2(l_i), mask=offs_g < GROUP)


@triton.jit
def _decode_merge_kernel(
    mid_o_ptr, mid_lse_ptr, o_ptr, seq_lens_ptr, stride_ot, stride_oh, H, D, WINDOW,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (request r, head h): log-sum-exp merge of the non-empty splits (split 0 never is)."""
    r, h = tl.program_id(0), tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + r)
    n = seq_len - tl.maximum(seq_len - WINDOW, 0)  # keys seen
    offs_s = tl.arange(0, BLOCK_S)  # [BS]
    offs_d = tl.arange(0, BLOCK_D)  # [BD]
    s_ok = (offs_s < NUM_SPLITS) & (offs_s * tl.cdiv(n, NUM_SPLITS) < n)  # [BS]
    part = (r * H + h) * NUM_SPLITS + offs_s  # [BS]
    lse = tl.load(mid_lse_ptr + part, mask=s_ok, other=float("-inf"))  # [BS]
    o = tl.load(mid_o_ptr + part[:, None] * D + offs_d[None, :],
                mask=s_ok[:, None] & (offs_d < D)[None, :], other=0.0)  # [BS, BD]
    w = tl.exp2(lse - tl.max(lse, 0))  # [BS], 0 for empty splits
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)  # [BD]
    tl.store(o_ptr + r * stride_ot + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty), mask=offs_d < D)


@dataclass
class TritonAttentionMetadata:
    """Per-step index tensors shared by all layers, on `req_to_token`'s device."""

    req_to_token: torch.Tensor  # [R, C] KV slot of each token position of each request row
    req_pool_indices: torch.Tensor  # [B] each request's row in req_to_token
    qo_start: torch.Tensor  # [B] int64 first row of each request in the flat sequence
    prefix_lens: torch.Tensor  # [B] int64
    extend_lens: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64
    max_extend: int
    is_decode: bool
    num_kv_splits: int
    window: int | None = None  # sliding-window layers': each query sees its `window` latest keys

    @classmethod
    def build(cls, fb: ForwardBatch, req_to_token: torch.Tensor, num_kv_splits: int = 8,
              window: int | None = None) -> TritonAttentionMetadata:
        """Index tensors from `fb`'s host lists: one host->device copy, no device->host sync."""
        if num_kv_splits < 1:
            raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
        if window is not None and window < 1:
            raise ValueError(f"a sliding window must hold at least one key, got {window}")
        seq_lens = fb.seq_lens
        if max(seq_lens, default=0) > req_to_token.shape[1]:
            raise ValueError(f"a sequence of {max(seq_lens)} tokens exceeds req_to_token's {req_to_token.shape[1]}")
        qo_start = list(itertools.accumulate(fb.extend_lens, initial=0))[:-1]
        host = torch.tensor([qo_start, fb.prefix_lens, fb.extend_lens, seq_lens], dtype=torch.int64)  # [4, B]
        req_idx = fb.req_pool_indices
        if req_idx.device.type == "cpu":  # ride along in the same copy
            host = torch.cat([host, req_idx.to(torch.int64)[None]])  # [5, B]
        packed = to_device(host, req_to_token.device)
        req_idx = packed[4] if req_idx.device.type == "cpu" else req_idx.to(req_to_token.device)
        return cls(req_to_token, req_idx, packed[0], packed[1], packed[2], packed[3],
                   max(fb.extend_lens, default=0), fb.is_decode, num_kv_splits, window)


def _dot_precision(dtype: torch.dtype) -> str | None:
    """Exact fp32 products for fp32 inputs (no tf32); None: 16-bit inputs use `tl.dot`'s native path."""
    return "ieee" if dtype == torch.float32 else None


def triton_attention(
    q: torch.Tensor,  # [T, H, D]
    k_buffer: torch.Tensor,  # [N, Hkv, D]
    v_buffer: torch.Tensor,  # [N, Hkv, D]
    meta: TritonAttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [T, H * D]
    """Causal attention of each request's new queries over its cached prefix and new tokens (their
    `meta.window` latest, where set).

    Same contract as `layers/attention/torch_backend.attention`: the new tokens' K/V are already in
    the buffers, and key j of request r lives at slot `req_to_token[req_pool_indices[r], j]`. K/V
    buffers need a contiguous last dimension; the output has q's dtype.
    """
    t, h, d = q.shape
    h_kv = k_buffer.shape[1]
    if h % h_kv:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({h_kv})")
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)  # [T, H, D]
    group = h // h_kv
    block_d = max(16, triton.next_power_of_2(d))
    wide = q.dtype == torch.float32 or block_d > 128  # fp32 or D = 256 tiles: halve the blocks
    precision = _dot_precision(q.dtype)
    upcast = q.device.type == "cpu" and q.dtype == torch.bfloat16  # CPU tensors: the Triton interpreter
    qk_scale = scale * _LOG2E
    window = meta.window or _NO_WINDOW
    r2t = meta.req_to_token
    kv_strides = (k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1))
    if meta.is_decode:
        b, splits = meta.seq_lens.shape[0], meta.num_kv_splits
        mid_o = torch.empty((b, h, splits, d), dtype=torch.float32, device=q.device)  # [B, H, S, D]
        mid_lse = torch.empty((b, h, splits), dtype=torch.float32, device=q.device)  # [B, H, S]
        _decode_split_kernel[(b, h_kv, splits)](
            q, k_buffer, v_buffer, mid_o, mid_lse, r2t, meta.req_pool_indices, meta.seq_lens,
            q.stride(0), q.stride(1), *kv_strides, r2t.stride(0), qk_scale, h, d, window,
            GROUP=group, NUM_SPLITS=splits, BLOCK_H=max(16, triton.next_power_of_2(group)),
            BLOCK_N=32 if wide else 64, BLOCK_D=block_d, PRECISION=precision, UPCAST=upcast, num_warps=4, num_stages=2,
        )
        _decode_merge_kernel[(b, h)](
            mid_o, mid_lse, out, meta.seq_lens, out.stride(0), out.stride(1), h, d, window,
            NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, num_warps=2,
        )
    else:
        block_m = block_n = 32 if wide else 64
        grid = (meta.seq_lens.shape[0], h, triton.cdiv(meta.max_extend, block_m))
        _extend_kernel[grid](
            q, k_buffer, v_buffer, out, r2t, meta.req_pool_indices, meta.qo_start, meta.prefix_lens,
            meta.extend_lens, q.stride(0), q.stride(1), *kv_strides, out.stride(0), out.stride(1), r2t.stride(0),
            qk_scale, d, window, GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
            PRECISION=precision, UPCAST=upcast, num_warps=4, num_stages=2 if block_d <= 128 else 1,
        )
    return out.view(t, h * d)
