"""Rotary embedding and the K/V store of one layer in one Triton launch: the GPU twin of the C
`layer_ops.rope_store`.

The torch path spends ~16 launches a layer on this (`Rotary.apply`: 2 chunks, 4 muls, a sub, an add,
a cat and a cast, for q and for k; then two indexed stores), each a CUDA graph node or, in eager
steps, a kernel launch of its own. Here a program takes one head of one token of the fused q/k/v
projection: a q head is rotated in place, a k head rotated and written to its KV slot, a v head
copied to its slot. The rotation runs in float32 (the torch path rounds after each op in the
model's dtype), as HF's `apply_rotary_pos_emb` on float32 tables.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_store_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos_ptr, loc_ptr, k_ptr, v_ptr,
    stride_t, stride_cos, stride_kn, stride_kh, stride_vn, stride_vh,
    H: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
):
    """Program (token t, head h): heads 0 .. H are q, then HKV k heads, then HKV v heads."""
    t, h = tl.program_id(0), tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    row = qkv_ptr + t * stride_t + h * 2 * HALF
    x1 = tl.load(row + offs, mask=mask)
    x2 = tl.load(row + HALF + offs, mask=mask)
    loc = tl.load(loc_ptr + t)
    if h < H + HKV:
        pos = tl.load(pos_ptr + t)
        cos = tl.load(cos_ptr + pos * stride_cos + offs, mask=mask)
        sin = tl.load(sin_ptr + pos * stride_cos + offs, mask=mask)
        a, b = x1.to(tl.float32), x2.to(tl.float32)
        y1 = (a * cos - b * sin).to(x1.dtype)
        y2 = (b * cos + a * sin).to(x1.dtype)
        if h < H:
            tl.store(row + offs, y1, mask=mask)
            tl.store(row + HALF + offs, y2, mask=mask)
        else:
            dst = k_ptr + loc * stride_kn + (h - H) * stride_kh
            tl.store(dst + offs, y1.to(k_ptr.dtype.element_ty), mask=mask)
            tl.store(dst + HALF + offs, y2.to(k_ptr.dtype.element_ty), mask=mask)
    else:
        dst = v_ptr + loc * stride_vn + (h - H - HKV) * stride_vh
        tl.store(dst + offs, x1.to(v_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + HALF + offs, x2.to(v_ptr.dtype.element_ty), mask=mask)


def rope_store(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor, loc: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> None:
    """qkv [T, (H + 2 Hkv) D] (rows contiguous): q heads rotated in place; k heads rotated and v heads
    stored at KV slots `loc` [T] of k_buffer / v_buffer [N, Hkv, D]. cos, sin: float32 [P, D/2] tables
    indexed by `positions` [T]."""
    t, width = qkv.shape
    d = k_buffer.shape[-1]
    if width != (num_heads + 2 * num_kv_heads) * d or d % 2 or qkv.stride(1) != 1:
        raise ValueError(f"rope_store: qkv {tuple(qkv.shape)} is not [T, ({num_heads} + 2 * {num_kv_heads}) * {d}] "
                         "with contiguous rows")
    if t == 0:
        return
    _rope_store_kernel[(t, num_heads + 2 * num_kv_heads)](
        qkv, cos, sin, positions, loc, k_buffer, v_buffer,
        qkv.stride(0), cos.stride(0), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        H=num_heads, HKV=num_kv_heads, HALF=d // 2, BLOCK=triton.next_power_of_2(d // 2),
    )
