"""Attention backend selection, the Triton backend inside the engine, and the device copy of
req_to_token (written by the scheduler, applied in stream order before each forward)."""

from __future__ import annotations

import pytest
import torch

from radixgen.radix_cache.memory_pool import ReqToTokenPool
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.layers.attention import get_attention_backend
from tests.conftest import build_tiny_model


def test_backend_selection(monkeypatch):
    cpu = torch.device("cpu")
    assert get_attention_backend("auto", cpu).name == "torch"
    assert get_attention_backend("triton", cpu).name == "triton"  # TRITON_INTERPRET=1 (conftest)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        get_attention_backend("triton", cpu)
    with pytest.raises(ValueError, match="attention_backend"):
        EngineConfig(attention_backend="flash")


def test_device_table_follows_host_writes():
    pool = ReqToTokenPool(4, 16)
    torch.manual_seed(0)
    for _ in range(20):
        slot, start = int(torch.randint(0, 4, ())), int(torch.randint(0, 12, ()))
        pool.write(slot, start, torch.randint(1, 100, (int(torch.randint(0, 5, ())),)))
        if torch.rand(()) < 0.3:  # steps apply whatever was queued before them
            pool.apply(pool.take_updates())
    pool.apply(pool.take_updates())
    assert pool.take_updates() is None
    assert torch.equal(pool.device_table, pool.req_to_token)


def test_write_runs_equals_row_by_row_writes():
    """A step's batched allocation write (`write_runs`: decode runs of one slot, prefill runs of many,
    empty runs) lands where a naive table of Python lists says, on the host and on the device copy."""
    size, width = 6, 20
    pool = ReqToTokenPool(size, width)
    naive = [[0] * width for _ in range(size)]
    g = torch.Generator().manual_seed(1)
    for step in range(40):
        slots = torch.randperm(size, generator=g)[: int(torch.randint(1, size + 1, (), generator=g))].tolist()
        decode = step % 2 == 0
        lens = [1 if decode else int(torch.randint(0, 5, (), generator=g)) for _ in slots]
        starts = [int(torch.randint(0, width - n + 1, (), generator=g)) for n in lens]
        values = torch.randint(1, 1000, (sum(lens),), generator=g)
        pool.write_runs(slots, starts, lens, values)
        flat = values.tolist()
        for slot, start, n in zip(slots, starts, lens, strict=True):
            naive[slot][start : start + n], flat = flat[:n], flat[n:]
        if step % 3 == 0:
            pool.apply(pool.take_updates())
    pool.apply(pool.take_updates())
    assert pool.req_to_token.tolist() == naive
    assert pool.device_table.tolist() == naive
    with pytest.raises(ValueError, match="past the end of its row"):
        pool.write_runs([0], [width - 1], [2], torch.ones(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="3 values"):
        pool.write_runs([0, 1], [0, 0], [1, 1], torch.ones(3, dtype=torch.int64))


def test_triton_backend_engine_equals_torch(tiny_models, engine_greedy_outputs):
    model = str(tiny_models["llama"])
    assert engine_greedy_outputs(model, "triton") == engine_greedy_outputs(model, "torch")


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_decode_graph_runner_static_buffers_match_plain_forward(tiny_models, tmp_path, arch):
    """The CUDA-graph runner's static, padded decode path (run eagerly on CPU) gives the plain
    forward's logits: 3 requests padded to a captured size of 4, then 2 padded to 2 after a step.
    Mistral's 8-token window: two requests are past it, which the static batch (all prefixes 0, as
    captured) cannot tell, so its window layers must take the windowed metadata anyway."""
    from radixgen.runtime.executor.cuda_graph import DecodeGraphRunner
    from radixgen.runtime.executor.forward_batch import make_forward_batch
    from radixgen.runtime.executor.model_runner import ModelRunner

    path = tiny_models[arch] if arch in tiny_models else build_tiny_model(tmp_path / arch, arch, sliding_window=8)
    runner = ModelRunner(EngineConfig(model=str(path), attention_backend="triton",
                                      max_total_tokens=1024, max_running_requests=8))
    graphs = DecodeGraphRunner(runner.model, runner.token_to_kv_pool, runner.req_to_token_pool, runner.attention,
                               (1, 2, 4), capture=False)
    pool = runner.req_to_token_pool
    slots, lens = [pool.alloc() for _ in range(3)], [5, 17, 9]
    prompts = [[(7 * i + j) % 500 + 3 for j in range(n)] for i, n in enumerate(lens)]
    for slot, ids in zip(slots, prompts, strict=True):
        loc = runner.token_to_kv_pool.alloc(len(ids))
        pool.write(slot, 0, loc)
        runner.forward(make_forward_batch([ids], [0], [slot], loc, table_update=pool.take_updates()))
    for batch in (slots, slots[1:]):
        n = [lens[slots.index(s)] for s in batch]
        loc = runner.token_to_kv_pool.alloc(len(batch))
        for s, length, slot_loc in zip(batch, n, loc, strict=True):
            pool.write(s, length, slot_loc[None])
        fb = make_forward_batch([[11 + s] for s in batch], n, batch, loc, table_update=pool.take_updates())
        assert graphs.can_run(fb)
        plain = runner.forward(fb)
        fb.table_update = None
        torch.testing.assert_close(graphs.forward(fb), plain, atol=1e-5, rtol=1e-5)
        for s in batch:
            lens[slots.index(s)] += 1


def _naive_attention(q, k_buffer, v_buffer, r2t_rows, prefix_lens, extend_lens, scale):
    """Per request, per query: softmax over its visible keys, in float64 (the oracle)."""
    out, t = [], 0
    h, h_kv = q.shape[1], k_buffer.shape[1]
    for row, p, e in zip(r2t_rows, prefix_lens, extend_lens, strict=True):
        keys = k_buffer[row[: p + e]].double().repeat_interleave(h // h_kv, 1)  # [S, H, D]
        vals = v_buffer[row[: p + e]].double().repeat_interleave(h // h_kv, 1)
        for i in range(e):
            s = torch.einsum("hd,shd->hs", q[t + i].double(), keys[: p + i + 1]) * scale  # [H, S]
            out.append(torch.einsum("hs,shd->hd", s.softmax(-1), vals[: p + i + 1]).reshape(-1))
        t += e
    return torch.stack(out)


@pytest.mark.parametrize("h,h_kv", [(4, 4), (6, 2)])
@pytest.mark.parametrize("extend_lens", [[1, 1, 1], [1, 1, 1, 1], [5, 1, 9], [3, 7], [70]], ids=str)
def test_shared_prefix_cascade_matches_naive(h, h_kv, extend_lens):
    """Requests whose KV rows start with the same slots take the cascade path (shared part once,
    merged by log-sum-exp), as does one request extending a cached prefix by a long chunk (its prefix,
    then its own keys causally); results equal a naive per-request softmax."""
    from radixgen.runtime.executor.forward_batch import make_forward_batch
    from radixgen.runtime.layers.attention.torch_backend import SHARED_PREFIX_MIN, AttentionMetadata, attention

    g = torch.Generator().manual_seed(len(extend_lens) * 10 + h)
    shared, d = SHARED_PREFIX_MIN + 37, 16
    own = [int(x) for x in torch.randint(0, 40, (len(extend_lens),), generator=g)]
    own[0] = 0  # one request's cached prefix is exactly the shared part
    prefix_lens = [shared + o for o in own]
    seqs = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    n_slots = shared + sum(s - shared for s in seqs)
    perm = torch.randperm(n_slots, generator=g) + 1
    r2t = torch.zeros(len(seqs), max(seqs), dtype=torch.int64)
    at, loc = shared, []
    for i, s in enumerate(seqs):
        r2t[i, :shared] = perm[:shared]
        r2t[i, shared:s] = perm[at : at + s - shared]
        at += s - shared
        loc.append(r2t[i, prefix_lens[i] : s])
    k = torch.randn(n_slots + 1, h_kv, d, generator=g)
    v = torch.randn(n_slots + 1, h_kv, d, generator=g)
    q = torch.randn(sum(extend_lens), h, d, generator=g)
    fb = make_forward_batch([[0] * e for e in extend_lens], prefix_lens, list(range(len(seqs))), torch.cat(loc))
    meta = AttentionMetadata.build(fb, r2t)
    assert any(c.shared is not None and len(c.shared) >= shared for c in meta.calls)
    ours = attention(q, k, v, meta, 0.25)
    ref = _naive_attention(q, k, v, r2t, prefix_lens, extend_lens, 0.25)
    assert (ours.double() - ref).abs().max().item() <= 1e-5
