"""Tensor parallelism through the Engine: SmolLM2 (9 query heads, 3 KV heads) at tp=3 gives the greedy
outputs of tp=1, also on radix-cache hits; a tp size that does not split the heads is a clear error
before any process starts; a rank that dies fails the engine with a message naming it, never a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest

from radixgen.runtime.engine import Engine

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
SHARED = "You are a careful assistant. Answer briefly and precisely. " * 3


@pytest.mark.slow
def test_smollm2_tp3_greedy_equals_tp1(engine):
    prompts = [SHARED + q for q in ("What is the capital of France?", "Name a prime number.", "Count to five.")]
    expected = [o["output_ids"] for o in engine.generate(prompts, GREEDY)]
    with Engine(tp_size=3, max_total_tokens=4096, max_running_requests=8) as tp:
        first = tp.generate(prompts[0], GREEDY)
        rest = tp.generate(prompts[1:], GREEDY)  # these extend the cached shared prefix
        again = tp.generate(prompts[0], GREEDY)  # the whole prompt is cached now
    assert [first["output_ids"]] + [o["output_ids"] for o in rest] == expected
    assert min(o["meta_info"]["cached_tokens"] for o in rest) >= 30
    assert again["meta_info"]["cached_tokens"] == len(engine.tokenizer.encode(prompts[0])) - 1
    assert again["output_ids"] == expected[0]


def test_tp_size_must_split_the_heads(tiny_models):
    with pytest.raises(ValueError, match=r"tp_size=3 does not divide this model's 4 attention heads.*\[1, 2, 4\]"):
        Engine(model=str(tiny_models["llama"]), tp_size=3)


def test_a_dead_rank_fails_the_engine_with_a_clear_error(tiny_models):
    eng = Engine(model=str(tiny_models["llama"]), tp_size=2, max_total_tokens=4096)
    try:
        assert eng.generate("warm up", {"max_new_tokens": 2})["meta_info"]["finish_reason"]["type"] == "length"
        stream = eng.generate("Tell me a long story", {"max_new_tokens": 3000, "ignore_eos": True}, stream=True)
        next(stream)  # decoding has started
        os.kill(eng.runner.ranks.pids[1], signal.SIGKILL)
        start = time.monotonic()
        chunks = list(stream)
        last = chunks[-1]
        assert time.monotonic() - start < 30
        reason = last["meta_info"]["finish_reason"]
        assert reason["type"] == "abort"
        assert "tensor-parallel rank 1" in reason["message"] and "SIGKILL" in reason["message"]
        with pytest.raises(RuntimeError, match="tensor-parallel rank 1"):
            eng.generate("anything", {"max_new_tokens": 2})
    finally:
        eng.shutdown()
