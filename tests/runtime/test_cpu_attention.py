"""The C decode-attention kernel against a float64 softmax(q k^T) v written out per request, and
inside the engine against SDPA (greedy outputs)."""

from __future__ import annotations

import pytest
import torch

from radixgen.radix_cache import kv_quant
from radixgen.runtime.kernels import decode_attention as cpu_attention
from radixgen.runtime.kernels import ffi
from radixgen.runtime.layers.attention import get_attention_backend

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the kernel")


def kv_buffer(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [N, Hkv, D] as a KV buffer of `dtype` (int8: rows with scales)."""
    return kv_quant.quantize(x) if dtype == torch.int8 else x.to(dtype)


def kv_values(buf: torch.Tensor) -> torch.Tensor:
    """The float32 values a KV buffer holds."""
    return kv_quant.dequantize(buf, torch.float32) if buf.dtype == torch.int8 else buf.float()


def naive(q, k_buf, v_buf, table, rows, lens, scale):
    """float64 attention of each request's query over its slots, one request at a time."""
    b, h, d = q.shape
    group = h // k_buf.shape[1]
    out = []
    for i in range(b):
        slots = table[rows[i], : lens[i]]
        k = k_buf[slots].double().repeat_interleave(group, 1)  # [S, H, D]
        v = v_buf[slots].double().repeat_interleave(group, 1)
        p = torch.softmax(torch.einsum("hd,shd->hs", q[i].double(), k) * scale, -1)  # [H, S]
        out.append(torch.einsum("hs,shd->hd", p, v).reshape(h * d))
    return torch.stack(out)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 8, 64), (32, 8, 64), (14, 2, 64), (8, 2, 128),
                                                     (16, 8, 128), (12, 2, 48), (10, 1, 40), (4, 4, 16)])
@pytest.mark.parametrize("dtype,q_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                           (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                           (torch.int8, torch.float32)])
def test_decode_attention_matches_naive(heads, kv_heads, head_dim, dtype, q_dtype):
    """K/V in each KV cache dtype (a float32 model with a 16-bit cache: q float32), against float64 on
    the cache's own values."""
    g = torch.Generator().manual_seed(heads * 100 + head_dim)
    lens = torch.tensor([1, 2, 9, 17, 64, 300, 131])
    n_slots = int(lens.sum()) + 50
    k_buf = kv_buffer(torch.randn(n_slots, kv_heads, head_dim, generator=g) * 2, dtype)
    v_buf = kv_buffer(torch.randn(n_slots, kv_heads, head_dim, generator=g), dtype)
    table = torch.zeros(10, 320, dtype=torch.int64)
    rows = torch.randperm(10, generator=g)[: len(lens)]
    free = torch.randperm(n_slots - 1, generator=g) + 1  # scattered slots, as after cache churn
    start = 0
    for r, n in zip(rows.tolist(), lens.tolist(), strict=True):
        table[r, :n] = free[start : start + n]
        start += n
    q = torch.randn(len(lens), heads, head_dim, generator=g).to(q_dtype)
    scale = head_dim**-0.5
    out = cpu_attention.decode_attention(q, k_buf, v_buf, table, rows, lens, scale)
    ref = naive(q.float(), kv_values(k_buf), kv_values(v_buf), table, rows, lens, scale)
    assert out.dtype == q_dtype and out.shape == (len(lens), heads * head_dim)
    tol = 1e-5 if q_dtype == torch.float32 else 2e-2  # a bfloat16 output rounds
    assert (out.double() - ref).abs().max().item() <= tol


def assert_each_alone_and_exact(q, k_buf, v_buf, table, rows, lens, scale):
    """The batch's output row by row is bitwise each request's output alone, and matches float64."""
    together = cpu_attention.decode_attention(q, k_buf, v_buf, table, rows, lens, scale)
    for i in range(len(lens)):
        one = slice(i, i + 1)
        alone = cpu_attention.decode_attention(q[one], k_buf, v_buf, table, rows[one], lens[one], scale)
        assert torch.equal(together[i], alone[0]), i
    ref = naive(q, kv_values(k_buf), kv_values(v_buf), table, rows, lens, scale)
    assert (together.double() - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_rows_of_one_request_read_together_equal_each_alone(dtype):
    """Rows verifying drafts: consecutive rows on one req_to_token row whose lengths grow by one
    (crossing chunk boundaries), among other requests. Their chunks run as one work item; each row's
    output is bitwise the one it gets alone, and matches float64."""
    g = torch.Generator().manual_seed(5)
    heads, kv_heads, d = 9, 3, 64
    k_buf = kv_buffer(torch.randn(1200, kv_heads, d, generator=g), dtype)
    v_buf = kv_buffer(torch.randn(1200, kv_heads, d, generator=g), dtype)
    table = torch.zeros(4, 600, dtype=torch.int64)
    table[1, :600] = torch.randperm(1199, generator=g)[:600] + 1
    table[3, :300] = torch.randperm(1199, generator=g)[:300] + 1
    rows = torch.tensor([3, 1, 1, 1, 1, 1, 3])  # request 1 verifies 4 drafts: lengths 254..258 cross 256
    lens = torch.tensor([300, 254, 255, 256, 257, 258, 120])
    q = torch.randn(len(lens), heads, d, generator=g)
    assert_each_alone_and_exact(q, k_buf, v_buf, table, rows, lens, d**-0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_long_requests_in_longer_chunks(dtype):
    """Requests long enough for 256- and 512-key chunks (past 2,048 and 4,096 keys), and rows of one
    request whose lengths cross from 128- to 256-key chunks: each matches float64 and is bitwise the
    output it gets alone."""
    g = torch.Generator().manual_seed(7)
    heads, kv_heads, d, n_slots = 9, 3, 64, 12000
    k_buf = kv_buffer(torch.randn(n_slots, kv_heads, d, generator=g) * 2, dtype)
    v_buf = kv_buffer(torch.randn(n_slots, kv_heads, d, generator=g), dtype)
    table = torch.stack([torch.randperm(n_slots - 1, generator=g)[:9000] + 1 for _ in range(3)])
    rows = torch.tensor([0, 1, 1, 1, 1, 2])
    lens = torch.tensor([9000, 2047, 2048, 2049, 2050, 4097])
    q = torch.randn(len(lens), heads, d, generator=g)
    assert_each_alone_and_exact(q, k_buf, v_buf, table, rows, lens, d**-0.5)


def test_decode_attention_rejects_bad_input():
    q, kv = torch.randn(1, 4, 16), torch.randn(8, 2, 16)
    table, rows = torch.arange(8)[None], torch.tensor([0])
    with pytest.raises(ValueError, match="float32, bfloat16, float16 or int8"):
        cpu_attention.decode_attention(q, kv.double(), kv.double(), table, rows, torch.tensor([3]), 0.25)
    with pytest.raises(RuntimeError, match="sequence length"):
        cpu_attention.decode_attention(q, kv, kv, table, rows, torch.tensor([9]), 0.25)


def test_backend_choice():
    cpu = torch.device("cpu")
    assert get_attention_backend("torch", cpu, torch.float32).c_decode
    assert not get_attention_backend("torch-sdpa", cpu, torch.float32).c_decode
    assert get_attention_backend("torch", cpu, torch.float16).c_decode
    assert not get_attention_backend("torch", cpu, torch.float64).c_decode


def test_engine_c_decode_equals_sdpa(tiny_models, engine_greedy_outputs):
    """Greedy outputs with decode rows in C vs in SDPA, including decodes that all start with one
    cached 200-token prefix (the cascade kernel)."""
    model = str(tiny_models["llama"])
    assert engine_greedy_outputs(model, "torch", fork=True) == engine_greedy_outputs(model, "torch-sdpa", fork=True)


@pytest.mark.parametrize("heads,kv_heads,head_dim,batch",
                         [(9, 3, 64, 16), (8, 2, 32, 3), (4, 4, 16, 2), (6, 1, 48, 5), (6, 2, 18, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_prefix_decode_matches_naive(heads, kv_heads, head_dim, batch, dtype):
    """Cascade: a shared prefix of scattered slots (query groups of 24 split across requests and
    heads) plus own keys of different lengths per request."""
    g = torch.Generator().manual_seed(batch * heads)
    c = 97
    own = (torch.arange(batch) * 7) % 23 + 1  # own keys incl. the new token, >= 1
    n_slots = c + int(own.sum()) + 10
    k_buf = kv_buffer(torch.randn(n_slots, kv_heads, head_dim, generator=g) * 2, dtype)
    v_buf = kv_buffer(torch.randn(n_slots, kv_heads, head_dim, generator=g), dtype)
    free = torch.randperm(n_slots - 1, generator=g) + 1
    table = torch.zeros(batch + 2, 200, dtype=torch.int64)
    rows = torch.randperm(batch + 2, generator=g)[:batch]
    start = c
    for r, n in zip(rows.tolist(), own.tolist(), strict=True):
        table[r, :c] = free[:c]
        table[r, c : c + n] = free[start : start + n]
        start += n
    lens = c + own
    q = torch.randn(batch, heads, head_dim, generator=g).to(dtype)
    scale = head_dim**-0.5
    out = cpu_attention.shared_prefix_decode_attention(q, k_buf, v_buf, table, rows, lens, free[:c], scale)
    ref = naive(q.float(), kv_values(k_buf), kv_values(v_buf), table, rows, lens, scale)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (out.double() - ref).abs().max().item() <= tol
