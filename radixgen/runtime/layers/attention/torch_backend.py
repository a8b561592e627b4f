"""The torch attention backend (CPU): SDPA over gathered K/V, decode rows in C.

Each request's new queries attend causally to its cached prefix plus its own new tokens. The torch
path gathers every request's K/V through its `req_to_token` row into a padded [B, S, ...] tensor once
per layer and runs one batched scaled_dot_product_attention with a mask built once per step (no
Python loop over requests inside the layer loop). On CPU, decode rows instead go to our C kernel
(`kernels/decode_attention.py`), which reads K/V in place, and so do long prompt chunks where the
model runs them in bfloat16 (`kernels/extend_attention.py`).
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixgen.common.transfer import to_device
from radixgen.radix_cache import kv_quant
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.kernels import decode_attention as c_attention
from radixgen.runtime.kernels import extend_attention as c_extend
from radixgen.runtime.layers.attention.base import AttentionBackend


@dataclass
class SdpaCall:
    """One padded scaled_dot_product_attention call over a group of requests."""

    rows: torch.Tensor | None  # [n] rows of the flat sequence in this group (None: all, in order)
    kv_index: torch.Tensor  # [B, S_max] KV slot of each key position (0 = padding slot)
    q_pad_index: torch.Tensor | None  # [B, E_max] row (within the group) per padded query (None: no padding)
    q_unpad_mask: torch.Tensor | None  # [B, E_max] bool, real queries
    attn_mask: torch.Tensor | None  # [B, 1, E_max, S_max] bool (True = attend), additive fp32 with `shared`;
    # None: see is_causal
    is_causal: bool
    batch_size: int
    shared: torch.Tensor | None = None  # [C] KV slots of a prefix every request starts with (kv_index starts after it)


@dataclass
class DecodeCall:
    """Decode requests attended by the C kernel (`kernels/decode_attention.py`), K/V read through req_to_token."""

    rows: torch.Tensor | None  # [b] rows of the flat sequence (None: all, in order)
    req_to_token: torch.Tensor  # [R, L] int64
    req_rows: torch.Tensor  # [b] int64 each request's row in req_to_token
    seq_lens: torch.Tensor  # [b] int64 keys per request, its new token included
    shared: torch.Tensor | None = None  # [C] KV slots all requests start with (cascade), or None

    @classmethod
    def build(cls, rows: torch.Tensor | None, req_to_token: torch.Tensor, req_rows: torch.Tensor,
              prefix_lens: list[int]) -> DecodeCall:
        seq_lens = torch.tensor([p + 1 for p in prefix_lens], dtype=torch.int64)  # [b] (CPU)
        c = _shared_prefix(req_to_token, req_rows, prefix_lens)
        return cls(rows, req_to_token, req_rows, seq_lens, req_to_token[req_rows[0], :c] if c else None)


@dataclass
class ExtendCall:
    """Long prompt chunks attended in bfloat16 by the C kernel (`kernels/extend_attention.py`)."""

    rows: torch.Tensor | None  # [n] rows of the flat sequence (None: all, in order)
    req_to_token: torch.Tensor  # [R, L] int64
    req_rows: torch.Tensor  # [b] int64 each request's row in req_to_token
    prefix_lens: torch.Tensor  # [b] int64
    extend_lens: torch.Tensor  # [b] int64
    window: int | None = None  # sliding-window layers' window (None: every earlier key)

    @classmethod
    def build(cls, rows: torch.Tensor | None, req_to_token: torch.Tensor, req_rows: torch.Tensor,
              prefix_lens: list[int], extend_lens: list[int], window: int | None = None) -> ExtendCall:
        return cls(rows, req_to_token, req_rows, torch.tensor(prefix_lens, dtype=torch.int64),
                   torch.tensor(extend_lens, dtype=torch.int64), window)


@dataclass
class AttentionMetadata:
    """Per-step index tensors shared by all layers.

    Decode requests (one new token) and extend requests are attended in separate calls: padding a
    decode row to the longest extend of the step would multiply its work by that length (a mixed
    step with a 400-token prefill chunk and 39 decodes did 40x the attention it needed).

    Requests that begin with the same KV slots (a cached few-shot prefix, a system prompt, fork
    branches) attend to that shared part in one call over K/V gathered once, and to the rest per
    request; the two partial results merge by their log-sum-exp (cascade attention). Without it,
    64 requests on a 1000-token cached prefix gathered the prefix's K/V 64 times per layer.

    With `c_decode`, decode requests go to the C kernel instead of SDPA (CPU, float32/bf16 K/V);
    a prefix they all share is attended by batched GEMMs for all of them at once and merged
    (`kernels/decode_attention.shared_prefix_decode_attention`).

    With `bf16_extend_min`, requests extending by more tokens (long prompt chunks, whose GEMMs the
    model runs in bfloat16) go to the bfloat16 C prompt attention; the others keep float32.

    With `window` (sliding-window layers), each query attends to the `window` latest keys up to
    itself: decode rows through a table of each request's last `window` slots (C kernel), long
    prompt chunks through the bfloat16 C kernel with the window, the others through SDPA with the
    window in the mask (`_windowed`).
    """

    calls: list[SdpaCall | DecodeCall | ExtendCall]

    @classmethod
    def build(cls, fb: ForwardBatch, req_to_token: torch.Tensor, c_decode: bool = False,
              bf16_extend_min: int | None = None, window: int | None = None) -> AttentionMetadata:
        cut = sys.maxsize if bf16_extend_min is None else max(bf16_extend_min, 1)  # longer extends: bfloat16
        if window is not None:
            return cls(_windowed(fb, req_to_token, c_decode, cut, window))
        device = req_to_token.device
        lens = fb.extend_lens
        decode = [i for i, e in enumerate(lens) if e == 1]
        long = [i for i, e in enumerate(lens) if e > cut]
        if len(decode) == fb.batch_size and c_decode:
            return cls([DecodeCall.build(None, req_to_token, fb.req_pool_indices, fb.prefix_lens)])
        if len(long) == fb.batch_size:
            return cls([ExtendCall.build(None, req_to_token, fb.req_pool_indices, fb.prefix_lens, lens)])
        if not long and (not decode or len(decode) == fb.batch_size):
            return cls([_sdpa_call(fb.prefix_lens, lens, fb.req_pool_indices, None, req_to_token)])
        short = [i for i, e in enumerate(lens) if 1 < e <= cut]
        starts = [0, *itertools.accumulate(lens)][:-1]
        calls: list[SdpaCall | DecodeCall | ExtendCall] = []
        for group in filter(None, (decode, short, long)):
            rows = [r for i in group for r in range(starts[i], starts[i] + lens[i])]
            req_idx = to_device(torch.tensor(group, dtype=torch.int64), device)  # [b]
            req_rows, row_index = fb.req_pool_indices.index_select(0, req_idx), to_device(torch.tensor(rows), device)
            prefix_lens, extend_lens = [fb.prefix_lens[i] for i in group], [lens[i] for i in group]
            if group is decode and c_decode:
                calls.append(DecodeCall.build(row_index, req_to_token, req_rows, prefix_lens))
            elif group is long:
                calls.append(ExtendCall.build(row_index, req_to_token, req_rows, prefix_lens, extend_lens))
            else:
                calls.append(_sdpa_call(prefix_lens, extend_lens, req_rows, row_index, req_to_token))
        return cls(calls)


def _windowed(fb: ForwardBatch, req_to_token: torch.Tensor, c_decode: bool, cut: int,
              window: int) -> list[SdpaCall | DecodeCall | ExtendCall]:
    """The calls of a sliding-window layer: decode rows (C kernel, with `c_decode`) and extends longer
    than `cut` (bfloat16 C kernel) apart from the rest."""
    lens = fb.extend_lens
    decode = [i for i, e in enumerate(lens) if e == 1] if c_decode else []
    long = [i for i, e in enumerate(lens) if e > cut]
    rest = [i for i, e in enumerate(lens) if not (c_decode and e == 1) and e <= cut]
    starts = [0, *itertools.accumulate(lens)][:-1]
    calls: list[SdpaCall | DecodeCall | ExtendCall] = []
    for group in filter(None, (decode, long, rest)):
        whole = len(group) == fb.batch_size
        rows = None if whole else to_device(torch.tensor(
            [r for i in group for r in range(starts[i], starts[i] + lens[i])]), req_to_token.device)
        req_rows = fb.req_pool_indices if whole else fb.req_pool_indices.index_select(
            0, to_device(torch.tensor(group, dtype=torch.int64), req_to_token.device))
        prefix_lens = [fb.prefix_lens[i] for i in group]
        if group is decode:
            calls.append(_window_decode_call(rows, req_to_token, req_rows, prefix_lens, window))
        elif group is long:
            calls.append(ExtendCall.build(rows, req_to_token, req_rows, prefix_lens, [lens[i] for i in group], window))
        else:
            calls.append(window_sdpa_call(rows, req_to_token, req_rows, prefix_lens, [lens[i] for i in group], window))
    return calls


def _window_decode_call(rows: torch.Tensor | None, req_to_token: torch.Tensor, req_rows: torch.Tensor,
                        prefix_lens: list[int], window: int) -> DecodeCall:
    """Decode rows over a table of each request's last `window` KV slots [b, <= window]."""
    seq = torch.tensor([p + 1 for p in prefix_lens], dtype=torch.int64)  # [b] keys up to the new token
    lo = (seq - window).clamp_(min=0)  # [b] first key in the window
    n = seq - lo  # [b]
    pos = lo[:, None] + torch.arange(int(n.max()))[None, :]  # [b, n_max]
    pos = torch.minimum(pos, (seq - 1)[:, None])  # past a request's keys: repeats its last (unread)
    device = req_to_token.device
    table = req_to_token[req_rows[:, None], to_device(pos, device)]  # [b, n_max]
    return DecodeCall(rows, table, torch.arange(len(prefix_lens), device=device), n, None)


def window_sdpa_call(rows: torch.Tensor | None, req_to_token: torch.Tensor, req_rows: torch.Tensor,
                      prefix_lens: list[int], extend_lens: list[int], window: int) -> SdpaCall:
    """SDPA for new tokens whose keys are the `window` latest up to each query: each request's keys
    from the first its first query sees, the window and causality in the mask."""
    device = req_to_token.device
    lens = to_device(torch.tensor([prefix_lens, extend_lens], dtype=torch.int64), device)  # [2, B]
    prefix, extend = lens[0], lens[1]  # [B]
    seq = prefix + extend  # [B]
    lo = (prefix - window + 1).clamp(min=0)  # [B] the first key the first new token sees
    s_max = max(p + e - max(p - window + 1, 0) for p, e in zip(prefix_lens, extend_lens, strict=True))
    e_max, b = max(extend_lens), len(extend_lens)
    key_pos = lo[:, None] + torch.arange(s_max, device=device)[None, :]  # [B, S]
    key_ok = key_pos < seq[:, None]  # [B, S]
    slots = req_to_token[req_rows[:, None], key_pos.clamp(max=req_to_token.shape[1] - 1)]  # [B, S]
    kv_index = torch.where(key_ok, slots, torch.zeros_like(slots))
    q_idx = torch.arange(e_max, device=device)  # [E]
    q_valid = q_idx[None, :] < extend[:, None]  # [B, E]
    q_pos = prefix[:, None] + q_idx[None, :]  # [B, E]
    mask = key_pos[:, None, :] <= q_pos[:, :, None]  # [B, E, S]
    mask &= key_pos[:, None, :] > q_pos[:, :, None] - window
    mask &= key_ok[:, None, :]
    mask |= ~q_valid[:, :, None]  # padded query rows attend to everything (ignored later; avoids NaN)
    if b == 1 or e_max == 1:
        q_pad_index, q_unpad = None, None
    else:
        q_start = torch.cumsum(extend, 0) - extend  # [B]
        q_pad_index, q_unpad = torch.where(q_valid, q_start[:, None] + q_idx[None, :], 0), q_valid  # [B, E]
    return SdpaCall(rows, kv_index, q_pad_index, q_unpad, mask[:, None], False, b)


SHARED_PREFIX_MIN = 64  # shortest common prefix worth a separate attention call (CPU)


def _shared_prefix(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: list[int]) -> int:
    """Length of the KV-slot prefix all requests share (0 if under SHARED_PREFIX_MIN or not on CPU).

    Rows of one request alone (a decode verifying drafts: one row per draft) share nothing: they are
    attended as plain decode rows, so their logits are the very ones plain decoding computes."""
    n = min(prefix_lens)
    if len(prefix_lens) < 2 or n < SHARED_PREFIX_MIN or req_to_token.device.type != "cpu":
        return 0  # on a GPU, finding it would sync on the device; the Triton path does not need it
    if bool((req_pool_indices == req_pool_indices[0]).all()):
        return 0
    slots = req_to_token[req_pool_indices, :n]  # [B, n]
    same = (slots == slots[:1]).all(0)  # [n]
    c = int(same.cumprod(0).sum())
    return c if c >= SHARED_PREFIX_MIN else 0


def _sdpa_call(
    prefix_lens: list[int],
    extend_lens: list[int],
    req_pool_indices: torch.Tensor,  # [B]
    rows: torch.Tensor | None,
    req_to_token: torch.Tensor,
) -> SdpaCall:
    device = req_to_token.device
    lens = to_device(torch.tensor([prefix_lens, extend_lens], dtype=torch.int64), device)  # [2, B]
    prefix, extend = lens[0], lens[1]  # [B] each
    seq = prefix + extend
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    b, s_max, e_max = len(extend_lens), max(seq_lens), max(extend_lens)
    # One request continuing a cached prefix (a long prompt's later chunks): the prefix for every query
    # and its own keys causally, two flash calls merged by log-sum-exp, as the cascade below; one masked
    # call would compute every (query, key) pair, the causal half too.
    if b == 1 and min(e_max, prefix_lens[0]) >= SHARED_PREFIX_MIN and device.type == "cpu":
        row = req_to_token[req_pool_indices[0]]
        return SdpaCall(rows, row[prefix_lens[0] : s_max][None], None, None, None, True, 1, row[: prefix_lens[0]])
    c = _shared_prefix(req_to_token, req_pool_indices, prefix_lens)
    shared = req_to_token[req_pool_indices[0], :c] if c else None  # [C]
    key_pos = torch.arange(c, s_max, device=device)  # [S] positions of the keys this call gathers
    slots = req_to_token[req_pool_indices, c:s_max]  # [B, S]
    kv_index = torch.where(key_pos[None, :] < seq[:, None], slots, torch.zeros_like(slots))
    # One request without prefix: plain causal attention. Decodes of equal length: no mask at all.
    if b == 1 and prefix_lens[0] == 0:
        return SdpaCall(rows, kv_index, None, None, None, e_max > 1, 1)
    if e_max == 1 and min(seq_lens) == s_max:
        return SdpaCall(rows, kv_index, None, None, None, False, b, shared)
    q_pos = torch.arange(e_max, device=device)  # [E]
    q_valid = q_pos[None, :] < extend[:, None]  # [B, E]
    if b == 1 or e_max == 1:
        q_pad_index, q_valid_or_none = None, None
    else:
        starts = torch.cumsum(extend, 0) - extend  # [B]
        q_pad_index = torch.where(q_valid, starts[:, None] + q_pos[None, :], 0)  # [B, E]
        q_valid_or_none = q_valid
    # key j visible to query i of request r iff j <= prefix[r] + i and j < seq[r]
    limit = prefix[:, None] + q_pos[None, :]  # [B, E]
    mask = key_pos[None, None, :] <= limit[:, :, None]  # [B, E, S]
    mask &= key_pos[None, None, :] < seq[:, None, None]
    mask |= ~q_valid[:, :, None]  # padded query rows attend to everything (ignored later; avoids NaN)
    mask = mask[:, None]  # [B, 1, E, S]
    if shared is not None:  # the cascade's kernel takes an additive mask (0 / -inf); fp32 works for all dtypes
        mask = torch.zeros(mask.shape, device=device).masked_fill_(~mask, float("-inf"))
    return SdpaCall(rows, kv_index, q_pad_index, q_valid_or_none, mask, False, b, shared)


def attention(
    q: torch.Tensor,  # [T, H, D]
    k_buffer: torch.Tensor,  # [N, Hkv, D]
    v_buffer: torch.Tensor,  # [N, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [T, H * D]
    t, h, d = q.shape
    if len(meta.calls) == 1 and meta.calls[0].rows is None:
        return _run(q, k_buffer, v_buffer, meta.calls[0], scale)
    out = q.new_empty((t, h * d))
    for call in meta.calls:
        out.index_copy_(0, call.rows, _run(q.index_select(0, call.rows), k_buffer, v_buffer, call, scale))
    return out


def _run(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, call: SdpaCall | DecodeCall | ExtendCall,
         scale: float) -> torch.Tensor:  # [n, H * D]
    if isinstance(call, ExtendCall):
        return c_extend.extend_attention_bf16(q, k_buffer, v_buffer, call.req_to_token, call.req_rows,
                                              call.prefix_lens, call.extend_lens, scale, call.window)
    if isinstance(call, DecodeCall) and call.shared is not None:
        return c_attention.shared_prefix_decode_attention(q, k_buffer, v_buffer, call.req_to_token, call.req_rows,
                                                            call.seq_lens, call.shared, scale)
    if isinstance(call, DecodeCall):
        return c_attention.decode_attention(q, k_buffer, v_buffer, call.req_to_token, call.req_rows,
                                              call.seq_lens, scale)
    return _sdpa(q, k_buffer, v_buffer, call, scale)


def padded(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
           call: SdpaCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The call's queries [B, H, E, D] (padded per request) and its gathered keys and values
    [B, Hkv, S, D] each, in q's dtype, from q [n, H, D] and the K/V buffers [N, Hkv, D]."""
    n, h, d = q.shape
    b, s = call.kv_index.shape
    flat = call.kv_index.view(-1)  # index_select: ~4x faster than advanced indexing on CPU
    # the KV cache may hold another dtype than q (kv_cache_dtype): the gathered copy is converted
    k = kv_quant.gather(k_buffer, flat, q.dtype).view(b, s, -1, d).transpose(1, 2)  # [B, Hkv, S, D]
    v = kv_quant.gather(v_buffer, flat, q.dtype).view(b, s, -1, d).transpose(1, 2)  # [B, Hkv, S, D]
    rows = q if call.q_pad_index is None else q.index_select(0, call.q_pad_index.view(-1))  # [B * E, H, D]
    return rows.view(b, -1, h, d).transpose(1, 2), k, v


def unpadded(out: torch.Tensor, call: SdpaCall, n: int) -> torch.Tensor:
    """[B, H, E, D] -> the call's n real query rows [n, H * D]."""
    b, h, _, d = out.shape
    out = out.transpose(1, 2)  # [B, E, H, D]
    if call.q_unpad_mask is not None:
        out = out[call.q_unpad_mask]  # [n, H, D]
    return out.reshape(n, h * d)


def _sdpa(
    q: torch.Tensor,  # [n, H, D] the group's queries
    k_buffer: torch.Tensor,  # [N, Hkv, D]
    v_buffer: torch.Tensor,  # [N, Hkv, D]
    call: SdpaCall,
    scale: float,
) -> torch.Tensor:  # [n, H * D]
    qb, k, v = padded(q, k_buffer, v_buffer, call)
    if call.shared is None:
        out = F.scaled_dot_product_attention(
            qb, k, v, attn_mask=call.attn_mask, is_causal=call.is_causal, scale=scale,
            enable_gqa=qb.shape[1] != k.shape[1],
        )  # [B, H, E, D]
    else:
        out = _cascade(qb, k, v, k_buffer, v_buffer, call, scale)
    return unpadded(out, call, q.shape[0])


def _cascade(
    qb: torch.Tensor,  # [B, H, E, D]
    k: torch.Tensor,  # [B, Hkv, S, D] each request's keys after the shared prefix
    v: torch.Tensor,  # [B, Hkv, S, D]
    k_buffer: torch.Tensor,  # [N, Hkv, D]
    v_buffer: torch.Tensor,  # [N, Hkv, D]
    call: SdpaCall,
    scale: float,
) -> torch.Tensor:  # [B, H, E, D]
    """Attention over shared prefix + own keys as two calls merged by log-sum-exp."""
    b, h, e, d = qb.shape
    h_kv = k.shape[1]
    group = h // h_kv
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # returns (out, natural-log lse)
    ks = kv_quant.gather(k_buffer, call.shared, qb.dtype).transpose(0, 1)[None]  # [1, Hkv, C, D]
    vs = kv_quant.gather(v_buffer, call.shared, qb.dtype).transpose(0, 1)[None]  # [1, Hkv, C, D]
    # Every query sees every shared key, so all queries of a KV head's group (all requests, all
    # heads of the group) form one query sequence: no mask, no GQA expansion of the shared K/V.
    q_all = qb.view(b, h_kv, group, e, d).permute(1, 2, 0, 3, 4).reshape(1, h_kv, group * b * e, d)
    o1, lse1 = flash(q_all, ks, vs, 0.0, False, scale=scale)  # [1, Hkv, G*B*E, D], [1, Hkv, G*B*E]
    o1 = o1.view(h_kv, group, b, e, d).permute(2, 0, 1, 3, 4).reshape(b, h, e, d)  # [B, H, E, D]
    lse1 = lse1.view(h_kv, group, b, e).permute(2, 0, 1, 3).reshape(b, h, e)  # [B, H, E]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [B, H, S, D]
    o2, lse2 = flash(qb, k, v, 0.0, call.is_causal, attn_mask=call.attn_mask, scale=scale)  # [B, H, E, D], [B, H, E]
    lse = torch.logaddexp(lse1, lse2)  # [B, H, E]
    w1, w2 = (lse1 - lse).exp()[..., None], (lse2 - lse).exp()[..., None]  # [B, H, E, 1]
    return (o1 * w1 + o2 * w2).to(qb.dtype)


class TorchAttention(AttentionBackend):
    """SDPA over gathered K/V; with `c_decode`, decode rows read K/V in place in C (CPU) and a
    pure-decode step is offered to the model's one-call C decode (`decode_step`); with
    `bf16_extend_min` set (`use_bf16_long_extends`), long prompt chunks go to the bfloat16 C kernel."""

    name = "torch"
    supports_sliding_window = True

    def __init__(self, c_decode: bool) -> None:
        self.c_decode = c_decode
        self.bf16_extend_min: int | None = None

    def use_bf16_long_extends(self, min_len: int, kv_dtype: torch.dtype, heads: int, kv_heads: int,
                              head_dim: int) -> bool:
        if not (self.c_decode and c_extend.available(kv_dtype, heads, kv_heads, head_dim)):
            return False
        self.bf16_extend_min = min_len
        return True

    def init_metadata(self, fb: ForwardBatch, req_to_token: torch.Tensor,
                      window: int | None = None) -> AttentionMetadata:
        return AttentionMetadata.build(fb, req_to_token, c_decode=self.c_decode, bf16_extend_min=self.bf16_extend_min,
                                       window=window)

    def forward(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
        return attention(q, k_buffer, v_buffer, meta, scale)

    def decode_step(self, meta: AttentionMetadata) -> DecodeCall | None:
        call = meta.calls[0] if len(meta.calls) == 1 else None
        return call if isinstance(call, DecodeCall) and call.rows is None else None
