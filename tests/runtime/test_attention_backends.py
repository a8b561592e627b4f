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
