"""Attention with soft-capped scores (Gemma 2's `attn_logit_softcapping`), in torch on any device.

Gemma 2 bounds every attention score before the softmax: scores = cap * tanh(q.k * scale / cap). SDPA
and our C / Triton kernels take the scores as they come, so layers with a cap compute them explicitly
(the reference eager attention HF transformers runs Gemma 2 with): one call per step over every
request, keys gathered through `req_to_token`, causality and a sliding window (if the layer has one) in
the mask. It builds the [B, H, E, S] score tensor, so a prompt chunk costs E x S floats per head; the
one-call C decode never runs these layers (`DecoderLayer.one_call`).
"""

from __future__ import annotations

import torch

from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.layers.attention.torch_backend import SdpaCall, padded, unpadded, window_sdpa_call


def step_call(fb: ForwardBatch, req_to_token: torch.Tensor, window: int | None) -> SdpaCall:
    """The step's keys and mask for layers of sliding window `window` (None: every earlier key)."""
    seq_max = max(p + e for p, e in zip(fb.prefix_lens, fb.extend_lens, strict=True))
    return window_sdpa_call(None, req_to_token, fb.req_pool_indices, fb.prefix_lens, fb.extend_lens,
                            window or seq_max)  # a window as long as every sequence: plain causal


def softcap_attention(
    q: torch.Tensor,  # [T, H, D]
    k_buffer: torch.Tensor,  # [N, Hkv, D]
    v_buffer: torch.Tensor,  # [N, Hkv, D]
    call: SdpaCall,
    scale: float,
    cap: float,
) -> torch.Tensor:  # [T, H * D]
    """softmax(cap * tanh(q k^T * scale / cap) masked) v for the step's queries, the softmax in float32."""
    qb, k, v = padded(q, k_buffer, v_buffer, call)  # [B, H, E, D], [B, Hkv, S, D] x 2
    group = qb.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [B, H, S, D]
    scores = torch.matmul(qb, k.transpose(-1, -2)).float().mul_(scale)  # [B, H, E, S]
    scores = scores.div_(cap).tanh_().mul_(cap).masked_fill_(~call.attn_mask, float("-inf"))
    return unpadded(torch.matmul(scores.softmax(-1).to(q.dtype), v), call, q.shape[0])  # [T, H * D]
