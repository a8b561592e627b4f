"""Scheduler behaviour: continuous batching parity, chunked prefill, retraction, abort, metrics."""

from __future__ import annotations

import threading
import time

import pytest

from radixgen.runtime.engine import Engine

GREEDY = {"temperature": 0, "ignore_eos": True}


def mixed_prompts(n: int) -> list[str]:
    return [f"Item {i}: " + " ".join(["alpha", "beta", "gamma", "delta"][j % 4] for j in range(i % 9 * 5)) + " so"
            for i in range(n)]


def test_64_concurrent_requests_equal_alone(engine):
    prompts = mixed_prompts(64)
    params = [dict(GREEDY, max_new_tokens=4 + i % 5) for i in range(64)]
    engine.flush_cache()
    together = engine.generate(prompts, params)
    engine.flush_cache()
    alone = [engine.generate(p, s) for p, s in zip(prompts, params, strict=True)]
    assert [r["output_ids"] for r in together] == [r["output_ids"] for r in alone]
    assert all(len(r["output_ids"]) == s["max_new_tokens"] for r, s in zip(together, params, strict=True))


def test_requests_from_many_threads(engine):
    prompts = mixed_prompts(12)
    want = [r["output_ids"] for r in engine.generate(prompts, dict(GREEDY, max_new_tokens=6))]
    got: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        got[i] = engine.generate(prompts[i], dict(GREEDY, max_new_tokens=6))["output_ids"]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(12)] == want


def test_long_prompt_chunked_equals_unchunked():
    """Chunked prefill (1024-token chunks, each over the cached prefix) against one 2500-token chunk,
    both in float32 matrices: where long chunks run below float32's precision (wide_matmul_dtype auto),
    chunks of different lengths round differently (logprobs 0.03 apart with bfloat16 GEMMs, seen)."""
    chunked_engine = Engine(chunked_prefill_size=1024, wide_matmul_dtype="float32")
    whole = Engine(chunked_prefill_size=4096, wide_matmul_dtype="float32")
    try:
        ids = whole.tokenizer.encode(" ".join(f"token{i % 50}" for i in range(1300)))[:2500]
        assert len(ids) == 2500
        params = dict(GREEDY, max_new_tokens=6)
        chunked = chunked_engine.generate(input_ids=ids, sampling_params=params, return_logprob=True)
        unchunked = whole.generate(input_ids=ids, sampling_params=params, return_logprob=True)
    finally:
        chunked_engine.shutdown()
        whole.shutdown()
    assert chunked["output_ids"] == unchunked["output_ids"]
    a = [lp for lp, _ in chunked["meta_info"]["output_token_logprobs"]]
    b = [lp for lp, _ in unchunked["meta_info"]["output_token_logprobs"]]
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 2e-3


def test_decode_during_long_prefill_is_not_stalled():
    eng = Engine(chunked_prefill_size=256)
    try:
        long_ids = eng.tokenizer.encode(" ".join(f"w{i % 40}" for i in range(1500)))[:1500]
        stream = eng.generate("Hi, tell me about", dict(GREEDY, max_new_tokens=60), stream=True)
        next(stream)  # the short request is decoding
        span: dict[str, float] = {}

        def long_req() -> None:
            span["start"] = time.perf_counter()
            eng.generate(input_ids=long_ids, sampling_params=dict(GREEDY, max_new_tokens=1))
            span["end"] = time.perf_counter()

        t = threading.Thread(target=long_req)
        t.start()
        arrivals = [(time.perf_counter(), len(c["output_ids"])) for c in stream]
        t.join()
        during = sum(n for at, n in arrivals if span["start"] < at < span["end"])
        # 1,500 prompt tokens in 256-token chunks take 6 steps; the decode advances in each of them
        assert during >= 4
    finally:
        eng.shutdown()


def test_small_pool_forces_retraction_with_identical_outputs(engine):
    prompts = mixed_prompts(16)
    params = dict(GREEDY, max_new_tokens=40)
    engine.flush_cache()
    want = [r["output_ids"] for r in engine.generate(prompts, params)]
    small = Engine(max_total_tokens=500, max_running_requests=16)
    try:
        got = [r["output_ids"] for r in small.generate(prompts, params)]
        stats = small.get_stats()
        assert stats["retractions"] > 0
        assert got == want
        assert small.flush_cache() and small.get_stats()["kv_used"] == 0
    finally:
        small.shutdown()


def test_abort_half_mid_flight_frees_kv(engine):
    engine.flush_cache()
    streams = [engine.generate(p, dict(GREEDY, max_new_tokens=60), stream=True, rid=f"abort-{i}")
               for i, p in enumerate(mixed_prompts(8))]
    firsts = [next(s) for s in streams]
    assert all(f["meta_info"]["finish_reason"] is None for f in firsts)
    for i in range(0, 8, 2):
        engine.abort(f"abort-{i}")
    finals = {}
    for i, s in enumerate(streams):
        for chunk in s:
            finals[i] = chunk["meta_info"]["finish_reason"]
    assert all(finals[i]["type"] == "abort" for i in range(0, 8, 2))
    assert all(finals[i]["type"] == "length" for i in range(1, 8, 2))
    assert engine.flush_cache()
    assert engine.get_stats()["kv_used"] == 0


def test_abandoned_stream_is_aborted(engine):
    s = engine.generate("Tell me a long story about", dict(GREEDY, max_new_tokens=200), stream=True)
    next(s)
    s.close()  # the consumer went away: the engine aborts the request

    for _ in range(100):
        if engine.get_stats()["running"] == 0:
            break
        time.sleep(0.05)
    assert engine.get_stats()["running"] == 0
    assert engine.flush_cache() and engine.get_stats()["kv_used"] == 0


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_policies_give_same_outputs(policy, engine):
    prompts = mixed_prompts(10)
    eng = Engine(schedule_policy=policy)
    try:
        got = [r["output_ids"] for r in eng.generate(prompts, dict(GREEDY, max_new_tokens=5))]
    finally:
        eng.shutdown()
    assert got == [r["output_ids"] for r in engine.generate(prompts, dict(GREEDY, max_new_tokens=5))]


def test_metrics(engine):
    busy_before = engine.get_stats()["worker_busy_seconds"]
    start = time.perf_counter()
    engine.generate(mixed_prompts(3), dict(GREEDY, max_new_tokens=3))
    wall = time.perf_counter() - start
    s = engine.get_stats()
    # the worker's busy time grew, by at most the wall time the call took (one forward at a time)
    assert 0 < s["worker_busy_seconds"] - busy_before <= wall
    for key in ("running", "waiting", "kv_used", "kv_capacity", "cache_hit_rate", "prompt_throughput",
                "generation_throughput"):
        assert key in s
    assert s["generated_tokens"] >= 9 and s["ttft"].n >= 3 and s["itl"].n >= 6


def test_overlap_on_and_off_identical(engine):
    prompts = mixed_prompts(12)
    params = [dict(GREEDY, max_new_tokens=6 + i % 7, ignore_eos=False) for i in range(12)]
    params[3] = {"temperature": 0.8, "seed": 5, "max_new_tokens": 10, "frequency_penalty": 0.5}
    params[5] = dict(GREEDY, max_new_tokens=30, stop=[" the", "."])
    params[7] = {"temperature": 0, "max_new_tokens": 12, "regex": "[0-9]{2}-[a-z]{3,6}"}
    engine.flush_cache()
    on = engine.generate(prompts, params)
    off_engine = Engine(disable_overlap=True)
    # the worker's CUDA pipelining, forced on CPU: results are read and handed over on a second thread
    # while the worker goes on to the next batch (requests finish mid-flight, grammar, penalties, seeds)
    ahead_engine = Engine()
    ahead_engine.scheduler.worker.read_results_apart = True
    try:
        off = off_engine.generate(prompts, params)
        ahead = ahead_engine.generate(prompts, params)
        assert ahead_engine.flush_cache() and ahead_engine.get_stats()["kv_used"] == 0
    finally:
        off_engine.shutdown()
        ahead_engine.shutdown()
    assert [r["output_ids"] for r in on] == [r["output_ids"] for r in off] == [r["output_ids"] for r in ahead]
    assert [r["text"] for r in on] == [r["text"] for r in off] == [r["text"] for r in ahead]
    assert engine.flush_cache() and engine.get_stats()["kv_used"] == 0


@pytest.mark.parametrize("apart", [False, True])
def test_internal_error_fails_requests_instead_of_hanging(tiny_models, apart):
    """A failing forward (a stand-in for an engine bug: the embedding loses rows, so the lookup raises)
    ends the request in flight with "abort", and later calls raise at once instead of waiting;
    also when results are read on their own thread (the worker's CUDA pipelining, forced here)."""
    eng = Engine(str(tiny_models["llama"]), max_total_tokens=256)
    eng.scheduler.worker.read_results_apart = apart
    try:
        params = {"temperature": 0, "max_new_tokens": 2}
        ok = eng.generate(input_ids=[5, 6, 7], sampling_params=params)
        assert ok["meta_info"]["finish_reason"]["type"] == "length"
        eng.runner.model.embed.data = eng.runner.model.embed.data[:2]
        out = eng.generate(input_ids=[5, 6, 7, 8], sampling_params=params)
        reason = out["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "internal error" in reason["message"]
        with pytest.raises(RuntimeError, match="internal error.*start a new Engine"):
            eng.generate(input_ids=[5, 6], sampling_params=params)
        with pytest.raises(RuntimeError, match="internal error"):
            eng.flush_cache()
    finally:
        eng.shutdown()
