"""The bfloat16 C prompt-attention kernel against float64 causal softmax(q k^T) v written out per
request: on the inputs rounded to bfloat16 as the kernel rounds them (the only further rounding is
the softmax weights', to bfloat16), and on the exact inputs (the error the rounding costs). On AMX its
products run on tiles for head sizes that are multiples of 32 and on vdpbf16ps otherwise (48 here)."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.kernels import extend_attention as c_extend

pytestmark = pytest.mark.skipif(not c_extend.available(torch.float32),
                                reason="this CPU has no AVX512-BF16 (the kernel's only path)")


def naive(q, k_buf, v_buf, table, rows, prefix_lens, extend_lens, scale, rounded: bool,
          window: int | None = None) -> torch.Tensor:
    """float64 causal attention of each request's new queries over its prefix and its own keys (with
    `window`: keys within `window` positions of the query, itself included); with `rounded`,
    q * scale, K and V are first rounded to bfloat16."""
    out, t = [], 0
    group = q.shape[1] // k_buf.shape[1]
    for r, p, e in zip(rows.tolist(), prefix_lens.tolist(), extend_lens.tolist(), strict=True):
        slots = table[r, : p + e]
        k, v, qs = k_buf[slots].float(), v_buf[slots].float(), q[t : t + e] * scale
        if rounded:
            k, v, qs = k.bfloat16(), v.bfloat16(), qs.bfloat16()
        k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)  # [S, H, D]
        s = torch.einsum("thd,shd->hts", qs.double(), k)  # [H, E, S]
        key, pos = torch.arange(p + e)[None, :], p + torch.arange(e)[:, None]  # [1, S], [E, 1]
        visible = (key <= pos) & (key > pos - (window or p + e))  # [E, S]
        probs = s.masked_fill(~visible, float("-inf")).softmax(-1)
        out.append(torch.einsum("hts,shd->thd", probs, v).reshape(e, -1))
        t += e
    return torch.cat(out).float()


def scattered_table(g, seq_lens: list[int], width: int, n_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A req_to_token table [len + 3, width] whose requests hold random distinct slots (0 left unused),
    and each request's row in it."""
    table = torch.zeros(len(seq_lens) + 3, width, dtype=torch.int64)
    rows = torch.randperm(len(seq_lens) + 3, generator=g)[: len(seq_lens)]
    free = torch.randperm(n_slots - 1, generator=g) + 1
    start = 0
    for r, n in zip(rows.tolist(), seq_lens, strict=True):
        table[r, :n] = free[start : start + n]
        start += n
    return table, rows


@pytest.mark.parametrize("heads,kv_heads,head_dim",
                         [(9, 3, 64), (8, 8, 64), (14, 2, 64), (8, 2, 128), (4, 1, 256), (4, 1, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_extend_attention_matches_naive(heads, kv_heads, head_dim, dtype):
    """Requests with and without a cached prefix, extends not multiples of the kernel's tiles,
    scattered slots, in each 16/32-bit KV dtype."""
    g = torch.Generator().manual_seed(heads * 100 + head_dim)
    prefix_lens = torch.tensor([0, 70, 300, 1, 0])
    extend_lens = torch.tensor([100, 77, 5, 64, 2])
    n_slots = int((prefix_lens + extend_lens).sum()) + 40
    k_buf = (torch.randn(n_slots, kv_heads, head_dim, generator=g) * 2).to(dtype)
    v_buf = torch.randn(n_slots, kv_heads, head_dim, generator=g).to(dtype)
    table, rows = scattered_table(g, (prefix_lens + extend_lens).tolist(), 400, n_slots)
    q = torch.randn(int(extend_lens.sum()), heads, head_dim, generator=g) * 2
    scale = head_dim**-0.5
    out = c_extend.extend_attention_bf16(q, k_buf, v_buf, table, rows, prefix_lens, extend_lens, scale)
    out = out.view(q.shape[0], -1)
    # only the softmax weights' rounding differs from the oracle: |error| <= 2^-8 of max |v| (seen: 3e-3)
    torch.testing.assert_close(out, naive(q, k_buf, v_buf, table, rows, prefix_lens, extend_lens, scale, True),
                               rtol=0, atol=1e-2)
    exact = naive(q, k_buf, v_buf, table, rows, prefix_lens, extend_lens, scale, False)
    assert (out - exact).abs().mean().item() < 5e-3  # bfloat16 inputs: ~1e-3 on average (seen: 1.1e-3)


@pytest.mark.parametrize("window", [1, 5, 64, 100, 129, 512])
def test_sliding_window_matches_naive(window):
    """Sliding-window layers: windows shorter than a key block, on its edges, spanning several and
    longer than every sequence; requests whose prefixes end far past the window (their keys packed
    from the window's block on) and ones whose own new rows cross its edge."""
    g = torch.Generator().manual_seed(window)
    prefix_lens = torch.tensor([0, 700, 130, 3, 0, 1000])
    extend_lens = torch.tensor([300, 90, 45, 200, 1, 17])
    seq_lens = (prefix_lens + extend_lens).tolist()
    n_slots = sum(seq_lens) + 10
    k_buf, v_buf = torch.randn(n_slots, 2, 64, generator=g) * 2, torch.randn(n_slots, 2, 64, generator=g)
    table, rows = scattered_table(g, seq_lens, 1100, n_slots)
    q = torch.randn(int(extend_lens.sum()), 8, 64, generator=g) * 2
    out = c_extend.extend_attention_bf16(q, k_buf, v_buf, table, rows, prefix_lens, extend_lens, 0.125, window)
    want = naive(q, k_buf, v_buf, table, rows, prefix_lens, extend_lens, 0.125, True, window)
    torch.testing.assert_close(out.view(q.shape[0], -1), want, rtol=0, atol=1e-2)


def test_query_rows_read_in_place_from_fused_qkv_rows():
    """q as the model passes it, the q part of [T, (H + 2 Hkv) D] rows: the same result as a copy."""
    g = torch.Generator().manual_seed(3)
    k_buf, v_buf = torch.randn(300, 2, 64, generator=g), torch.randn(300, 2, 64, generator=g)
    table = torch.arange(300).view(1, 300).contiguous()
    qkv = torch.randn(200, (8 + 2 * 2) * 64, generator=g)
    q = qkv[:, : 8 * 64].view(200, 8, 64)
    assert not q.is_contiguous()
    args = (k_buf, v_buf, table, torch.tensor([0]), torch.tensor([50]), torch.tensor([200]), 0.125)
    assert torch.equal(c_extend.extend_attention_bf16(q, *args), c_extend.extend_attention_bf16(q.contiguous(), *args))


def test_each_request_is_independent_of_its_batch_mates():
    g = torch.Generator().manual_seed(7)
    k_buf, v_buf = torch.randn(600, 3, 64, generator=g), torch.randn(600, 3, 64, generator=g)
    table = torch.arange(600).view(2, 300).contiguous()
    q = torch.randn(250, 9, 64, generator=g)
    both = c_extend.extend_attention_bf16(q, k_buf, v_buf, table, torch.tensor([0, 1]), torch.tensor([20, 0]),
                                          torch.tensor([150, 100]), 0.125)
    first = c_extend.extend_attention_bf16(q[:150], k_buf, v_buf, table, torch.tensor([0]), torch.tensor([20]),
                                           torch.tensor([150]), 0.125)
    assert torch.equal(both[:150], first)


def test_shapes_past_the_kernels_limits_are_not_offered():
    assert c_extend.available(torch.float16, 9, 3, 64) and c_extend.available(torch.float32, 32, 2, 256)
    assert not c_extend.available(torch.float32, 34, 2, 64)  # 17 query heads per KV head
    assert not c_extend.available(torch.float32, 8, 8, 72)  # head_dim not a multiple of 16
    assert not c_extend.available(torch.float32, 8, 8, 320)
    assert not c_extend.available(torch.int8, 9, 3, 64)


def test_bad_inputs_are_refused():
    q, buf, table = torch.randn(4, 9, 64), torch.randn(16, 3, 64), torch.arange(16).view(1, 16)
    one, four = torch.tensor([0]), torch.tensor([4])
    with pytest.raises(ValueError, match="int8"):
        c_extend.extend_attention_bf16(q, buf.to(torch.int8), buf.to(torch.int8), table, one, one, four, 0.1)
    with pytest.raises(ValueError, match="extends sum to 3"):
        c_extend.extend_attention_bf16(q, buf, buf, table, one, one, torch.tensor([3]), 0.1)
    with pytest.raises(RuntimeError, match="past 16 keys"):  # 14 cached + 4 new keys in a 16-key row
        c_extend.extend_attention_bf16(q, buf, buf, table, one, torch.tensor([14]), four, 0.1)
    with pytest.raises(ValueError, match="window must be a positive"):
        c_extend.extend_attention_bf16(q, buf, buf, table, one, one, four, 0.1, window=0)
