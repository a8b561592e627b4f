"""Triton attention kernels against the torch attention path (sliding windows: against a float64
naive softmax): under the interpreter on CPU, and compiled on CUDA when a GPU is present (the root
conftest leaves TRITON_INTERPRET unset there)."""

from __future__ import annotations

import math

import pytest
import torch

from radixgen.runtime.executor.forward_batch import ForwardBatch, make_forward_batch
from radixgen.runtime.kernels.triton_attention import TritonAttentionMetadata, triton_attention
from radixgen.runtime.layers.attention.torch_backend import AttentionMetadata, attention

TOL = 2e-3
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(
    reqs: list[tuple[int, int]],  # (prefix_len, extend_len) per request
    h: int,
    h_kv: int,
    d: int,
    seed: int = 0,
    r2t_dtype: torch.dtype = torch.int32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, ForwardBatch, torch.Tensor]:
    """Random q [T, H, D], K/V pool, a ForwardBatch and req_to_token with shuffled slots and rows."""
    g = torch.Generator().manual_seed(seed)
    seqs = [p + e for p, e in reqs]
    n_slots = sum(seqs) + 7  # a few slots no request owns
    slots = torch.randperm(n_slots, generator=g) + 1  # [N] never the padding slot 0
    rows = torch.randperm(len(reqs) + 3, generator=g)[: len(reqs)].tolist()
    req_to_token = torch.zeros((len(reqs) + 3, max(seqs) + 5), dtype=r2t_dtype)
    out_cache_loc, start = [], 0
    for row, (p, _), s in zip(rows, reqs, seqs, strict=True):
        req_to_token[row, :s] = slots[start : start + s].to(r2t_dtype)
        out_cache_loc.append(slots[start + p : start + s])
        start += s
    k = torch.randn((n_slots + 1, h_kv, d), generator=g)  # [N+1, Hkv, D]
    v = torch.randn((n_slots + 1, h_kv, d), generator=g)
    q = torch.randn((sum(e for _, e in reqs), h, d), generator=g)  # [T, H, D]
    fb = make_forward_batch([[0] * e for _, e in reqs], [p for p, _ in reqs], rows, torch.cat(out_cache_loc),
                            device=DEVICE)
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), fb, req_to_token.to(DEVICE)


def _compare(reqs, h, h_kv, d, num_kv_splits: int = 8, seed: int = 0, r2t_dtype=torch.int32) -> None:
    q, k, v, fb, r2t = _case(reqs, h, h_kv, d, seed, r2t_dtype)
    scale = 1.0 / math.sqrt(d)
    ref = attention(q, k, v, AttentionMetadata.build(fb, r2t), scale)
    meta = TritonAttentionMetadata.build(fb, r2t, num_kv_splits)
    assert meta.is_decode == fb.is_decode
    out = triton_attention(q, k, v, meta, scale)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert (out - ref).abs().max().item() <= TOL


GQA = [(8, 8), (6, 2), (8, 2), (8, 1)]  # ratios 1, 3, 4, 8


@pytest.mark.parametrize("h,h_kv", GQA)
def test_extend_mixed_with_decode(h, h_kv):
    # prefixes 0, 1, random and 300; extends that span several query blocks; two decode rows.
    reqs = [(0, 37), (1, 5), (300, 9), (83, 1), (0, 1), (141, 20)]
    _compare(reqs, h, h_kv, d=64, seed=h * 10 + h_kv)


@pytest.mark.parametrize("prefix", [0, 1, 64, 217, 300])
def test_extend_single_request(prefix):
    _compare([(prefix, 33)], 4, 2, d=32, seed=prefix)


@pytest.mark.parametrize("h,h_kv", GQA)
def test_decode(h, h_kv):
    # seq lens 1 and < num_kv_splits leave splits empty; 8, 9, 64, 301 straddle split boundaries.
    reqs = [(0, 1), (2, 1), (6, 1), (7, 1), (8, 1), (63, 1), (300, 1)]
    _compare(reqs, h, h_kv, d=64, seed=h + h_kv)


@pytest.mark.parametrize("num_kv_splits", [1, 3, 16])
def test_decode_split_counts(num_kv_splits):
    _compare([(0, 1), (4, 1), (40, 1), (129, 1)], 4, 1, d=32, num_kv_splits=num_kv_splits)


@pytest.mark.parametrize("d", [48, 80])
def test_non_power_of_two_head_dim(d):
    _compare([(19, 13), (0, 1), (70, 4)], 6, 2, d, seed=d)  # extend
    _compare([(19, 1), (0, 1), (70, 1)], 6, 2, d, seed=d)  # decode


def test_int64_req_to_token_and_strided_q():
    _compare([(5, 7), (30, 1)], 4, 2, 32, r2t_dtype=torch.int64)
    q, k, v, fb, r2t = _case([(12, 6), (3, 1)], 4, 2, 32)
    qkv = torch.cat([q, torch.randn_like(q)], dim=1)  # [T, 2H, D]: q is a strided view of it
    scale = 0.125
    out = triton_attention(qkv[:, :4], k, v, TritonAttentionMetadata.build(fb, r2t), scale)
    ref = attention(q, k, v, AttentionMetadata.build(fb, r2t), scale)
    assert (out - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("reqs", [[(0, 9), (300, 5), (40, 1)], [(3, 1), (0, 1), (300, 1)]], ids=["extend", "decode"])
def test_bf16_inputs(reqs):
    q, k, v, fb, r2t = _case(reqs, 4, 2, 64)
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    scale = 0.125
    ref = attention(qb.float(), kb.float(), vb.float(), AttentionMetadata.build(fb, r2t), scale)  # fp32 torch
    out = triton_attention(qb, kb, vb, TritonAttentionMetadata.build(fb, r2t), scale)
    assert out.dtype == torch.bfloat16
    # bf16 output rounding alone is up to 2^-9 relative; softmax weights are bf16 in the P @ V product.
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=1e-2)


def test_build_accepts_valid_and_rejects_invalid():
    q, k, v, fb, r2t = _case([(0, 4), (2, 1), (5, 3)], 2, 1, 16)
    meta = TritonAttentionMetadata.build(fb, r2t)
    assert meta.qo_start.tolist() == [0, 4, 5]
    assert meta.seq_lens.tolist() == [4, 3, 8] and meta.max_extend == 4 and not meta.is_decode
    assert meta.req_pool_indices.tolist() == fb.req_pool_indices.tolist()
    # a sequence that fills its req_to_token row exactly, one split, and more splits than tokens
    full = make_forward_batch([[0]], [r2t.shape[1] - 1], [0], torch.tensor([1]))
    for splits in (1, 64):
        assert TritonAttentionMetadata.build(full, r2t, splits).is_decode
    with pytest.raises(ValueError, match="num_kv_splits"):
        TritonAttentionMetadata.build(fb, r2t, 0)
    too_long = make_forward_batch([[0, 0]], [r2t.shape[1] - 1], [0], torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="exceeds"):
        TritonAttentionMetadata.build(too_long, r2t)
    with pytest.raises(ValueError, match="multiple"):
        kv = torch.zeros(9, 2, 16)  # [N, Hkv=2, D]: 3 query heads cannot share 2 KV heads
        triton_attention(torch.zeros(8, 3, 16), kv, kv, meta, 1.0)


def _naive_windowed(q, k, v, fb: ForwardBatch, r2t, window: int, scale: float) -> torch.Tensor:
    """Per request and query: a float64 softmax over the `window` latest keys up to it (the oracle)."""
    out, t = [], 0
    h, h_kv = q.shape[1], k.shape[1]
    for row, p, e in zip(fb.req_pool_indices.tolist(), fb.prefix_lens, fb.extend_lens, strict=True):
        slots = r2t[row, : p + e].long()
        keys = k[slots].double().repeat_interleave(h // h_kv, 1)  # [S, H, D]
        vals = v[slots].double().repeat_interleave(h // h_kv, 1)
        for i in range(e):
            lo, hi = max(p + i + 1 - window, 0), p + i + 1
            s = torch.einsum("hd,shd->hs", q[t + i].double(), keys[lo:hi]) * scale  # [H, S]
            out.append(torch.einsum("hs,shd->hd", s.softmax(-1), vals[lo:hi]).reshape(-1))
        t += e
    return torch.stack(out).to(q.dtype)


@pytest.mark.parametrize("window", [1, 5, 16, 100, 1000])
@pytest.mark.parametrize("reqs", [
    [(0, 37), (1, 5), (300, 9), (83, 1), (0, 1), (141, 20)],  # extends past and within the window, decode rows
    [(0, 1), (2, 1), (15, 1), (16, 1), (17, 1), (300, 1)],  # pure decode: sequences shorter and longer than it
    [(0, 130)],  # one long extend: query blocks whose first keys lie far behind the window
], ids=["mixed", "decode", "long"])
def test_sliding_window_matches_naive(window, reqs):
    """Each query sees only the `window` latest keys up to itself: rows whose first tiles hold no key they
    see, decode splits of the window alone, and windows longer than the sequence (as global attention)."""
    q, k, v, fb, r2t = _case(reqs, 6, 2, 32, seed=window)
    scale = 32**-0.5
    meta = TritonAttentionMetadata.build(fb, r2t, window=window)
    out = triton_attention(q, k, v, meta, scale)
    ref = _naive_windowed(q.cpu(), k.cpu(), v.cpu(), fb, r2t.cpu(), window, scale)
    assert torch.isfinite(out).all()
    assert (out.cpu() - ref).abs().max().item() <= TOL
    with pytest.raises(ValueError, match="window"):
        TritonAttentionMetadata.build(fb, r2t, window=0)
