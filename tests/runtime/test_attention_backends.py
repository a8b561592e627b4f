"""Attention backend selection, the Triton backend inside the engine, and the device copy of
req_to_token (written by the scheduler, applied in stream order before each forward)."""

from __future__ import annotations

import pytest
import torch

from radixgen.radix_cache.memory_pool import ReqToTokenPool
from radixgen.runtime.attention import get_attention_backend
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.engine import Engine


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


def test_triton_backend_engine_equals_torch(tiny_models):
    """Greedy outputs of a mixed workload (prefix hits, chunked prefill, overlap) per backend."""
    prompts = [f"Item {i}: " + "alpha beta gamma " * (3 + 5 * i) for i in range(6)]
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    outs = {}
    for backend in ("torch", "triton"):
        eng = Engine(model=str(tiny_models["llama"]), attention_backend=backend, chunked_prefill_size=48,
                     max_total_tokens=4096)
        try:
            eng.generate(prompts[0], params)  # cached: later requests extend a shared prefix
            outs[backend] = [o["output_ids"] for o in eng.generate(prompts, params)]
            assert eng.get_stats()["cache_hit_rate"] > 0
        finally:
            eng.shutdown()
    assert outs["triton"] == outs["torch"]


def test_decode_graph_runner_static_buffers_match_plain_forward(tiny_models):
    """The CUDA-graph runner's static, padded decode path (run eagerly on CPU) gives the plain
    forward's logits: 3 requests padded to a captured size of 4, then 2 padded to 2 after a step."""
    from radixgen.runtime.cuda_graph import DecodeGraphRunner
    from radixgen.runtime.forward_batch import make_forward_batch
    from radixgen.runtime.model_runner import ModelRunner

    runner = ModelRunner(EngineConfig(model=str(tiny_models["llama"]), attention_backend="triton",
                                      max_total_tokens=1024, max_running_requests=8))
    graphs = DecodeGraphRunner(runner, (1, 2, 4), capture=False)
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
