"""One decoder layer's attention: rotary embedding, K/V store into the pool, the backend's attention.

Takes the fused q/k/v projection [T, (H + 2 Hkv) D]. The per-head q/k RMSNorm (Qwen3, Gemma 3), the
rotary and the K/V store are one call on the projection in place: C with `rope_in_c` (CPU float32,
`kernels/layer_ops.rope_store`), or Triton with `triton_rope` (the Triton attention backend,
`kernels/triton_rope.rope_store`, where no q/k norm comes between); otherwise torch ops. A
sliding-window layer (`window`) attends through the step's windowed metadata and may have its own
rotary table (`local_rope`: Gemma 3's local layers). A layer whose scores are soft-capped (`softcap`:
Gemma 2) attends in torch through the step's capped calls (`softcap.py`), not the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.radix_cache.memory_pool import TokenToKVPool
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.kernels import layer_ops
from radixgen.runtime.layers.attention.base import AttentionBackend
from radixgen.runtime.layers.attention.softcap import softcap_attention
from radixgen.runtime.layers.rotary import Rotary


@dataclass
class ForwardContext:
    """What every layer of one step needs besides its hidden states."""

    batch: ForwardBatch
    pool: TokenToKVPool
    backend: AttentionBackend
    meta: Any  # the backend's metadata for this step
    rotary: Rotary
    cos: torch.Tensor | None = None  # [T, 1, D/2] gathered once per step for torch-path layers
    sin: torch.Tensor | None = None
    wide: tuple[tuple[int, int], ...] = ()  # rows of long extends, for the matrices (layers/linear.Runs)
    window_meta: Any = None  # the backend's metadata for sliding-window layers (None: as `meta`)
    local_rotary: Rotary | None = None  # sliding-window layers' own rotary table, if any
    local_cos: torch.Tensor | None = None  # [T, 1, D/2] of `local_rotary`, for torch-path layers
    local_sin: torch.Tensor | None = None
    capped: dict[int | None, Any] | None = None  # soft-capped layers' SdpaCall per window (softcap.step_call)


class Attention(nn.Module):
    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int, qk_norm_eps: float | None,
                 scale: float | None = None, window: int | None = None, local_rope: bool = False,
                 softcap: float | None = None):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.window = window  # sliding window (keys, its own token included), None: all earlier tokens
        self.local_rope = local_rope  # rotary from the context's local table
        self.softcap = softcap  # scores = softcap * tanh(scores / softcap) (None: uncapped)
        self.eps = qk_norm_eps
        self.q_norm = nn.Parameter(torch.ones(head_dim)) if qk_norm_eps is not None else None
        self.k_norm = nn.Parameter(torch.ones(head_dim)) if qk_norm_eps is not None else None
        self.rope_in_c = False  # set by `use_c_kernels` where it applies
        self.triton_rope: Callable[..., None] | None = None  # Triton's rope_store (LlamaModel.prepare)

    @property
    def can_fuse_rope(self) -> bool:
        """Rotary and the K/V store can be one Triton kernel: no q/k norm comes between the projection and
        them (the C kernel takes the norms too)."""
        return self.q_norm is None

    def forward(self, qkv: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # [T, H * D]
        t = qkv.shape[0]
        fb, pool = ctx.batch, ctx.pool
        k_buf, v_buf = pool.k_buffer[self.layer_id], pool.v_buffer[self.layer_id]
        if self.rope_in_c or self.triton_rope is not None:
            rotary = ctx.local_rotary if self.local_rope else ctx.rotary
            args = (qkv, self.num_heads, self.num_kv_heads, rotary.cos, rotary.sin, fb.positions, fb.out_cache_loc,
                    k_buf, v_buf)
            if self.rope_in_c:
                layer_ops.rope_store(*args, q_norm=self.q_norm, k_norm=self.k_norm, eps=self.eps or 0.0)
            else:
                self.triton_rope(*args)
            q = qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim)
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(t, self.num_heads, self.head_dim)
            k = k.view(t, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None:
                q = F.rms_norm(q, (self.head_dim,), self.q_norm, self.eps)
                k = F.rms_norm(k, (self.head_dim,), self.k_norm, self.eps)
            cos, sin = (ctx.local_cos, ctx.local_sin) if self.local_rope else (ctx.cos, ctx.sin)
            q, k = Rotary.apply(q, cos, sin), Rotary.apply(k, cos, sin)
            pool.set_kv(self.layer_id, fb.out_cache_loc, k, v.view(t, self.num_kv_heads, self.head_dim))
        if self.softcap is not None:
            return softcap_attention(q, k_buf, v_buf, ctx.capped[self.window], self.scale, self.softcap)
        meta = ctx.window_meta if self.window is not None and ctx.window_meta is not None else ctx.meta
        return ctx.backend.forward(q, k_buf, v_buf, meta, self.scale)
