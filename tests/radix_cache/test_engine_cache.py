"""The radix cache inside the engine: same outputs on and off, hits reported, eviction, namespaces."""

from __future__ import annotations

import pytest

from radixgen.runtime.engine import Engine

SHARED = "You are a careful assistant. Answer in one short sentence.\nQ: "
QUESTIONS = ["What is the sun?", "Why is the sky blue?", "What is rain?", "Name a fruit."]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def no_cache_engine():
    eng = Engine(disable_radix_cache=True)
    yield eng
    eng.shutdown()


def test_outputs_identical_with_cache_on_and_off(engine, no_cache_engine):
    prompts = [SHARED + q + "\nA:" for q in QUESTIONS]
    off = [no_cache_engine.generate(p, GREEDY)["output_ids"] for p in prompts]
    engine.flush_cache()
    on_first = [engine.generate(p, GREEDY) for p in prompts]
    on_again = engine.generate(prompts, GREEDY)
    assert [r["output_ids"] for r in on_first] == off
    assert [r["output_ids"] for r in on_again] == off
    assert on_first[0]["meta_info"]["cached_tokens"] == 0
    assert all(r["meta_info"]["cached_tokens"] > 0 for r in on_first[1:])  # the shared prefix hit
    assert all(r["meta_info"]["cached_tokens"] == 0 for r in [no_cache_engine.generate(prompts[0], GREEDY)])


def test_identical_prompt_hits_all_but_last_token(engine):
    prompt = "The history of the printing press begins"
    n = len(engine.tokenizer.encode(prompt))
    engine.generate(prompt, {"max_new_tokens": 1})
    r = engine.generate(prompt, {"max_new_tokens": 1})
    assert r["meta_info"]["cached_tokens"] == n - 1


def test_namespaces_do_not_share(engine):
    prompt = "Tenant data: the secret launch code is 42."
    engine.generate(prompt, {"max_new_tokens": 1}, extra_key="tenant-a")
    other = engine.generate(prompt, {"max_new_tokens": 1}, extra_key="tenant-b")
    same = engine.generate(prompt, {"max_new_tokens": 1}, extra_key="tenant-a")
    assert other["meta_info"]["cached_tokens"] == 0
    assert same["meta_info"]["cached_tokens"] == len(engine.tokenizer.encode(prompt)) - 1


def test_flush_cache(engine):
    prompt = "Flushing empties the tree entirely"
    engine.generate(prompt, {"max_new_tokens": 1})
    assert engine.flush_cache()
    assert engine.get_stats()["kv_used"] == 0
    assert engine.generate(prompt, {"max_new_tokens": 1})["meta_info"]["cached_tokens"] == 0


def test_page_size_hits_are_page_aligned():
    eng = Engine(page_size=4)
    try:
        prompt = "Page aligned matching only reuses whole pages of KV"
        n = len(eng.tokenizer.encode(prompt))
        first = eng.generate(prompt, GREEDY)
        second = eng.generate(prompt, GREEDY)
        assert second["output_ids"] == first["output_ids"]
        assert second["meta_info"]["cached_tokens"] == (n - 1) // 4 * 4
    finally:
        eng.shutdown()


def test_eviction_under_tiny_pool_keeps_outputs_correct(no_cache_engine):
    eng = Engine(max_total_tokens=200, max_running_requests=4)
    try:
        prompts = [f"Story {i}: " + "a long winding road " * (3 + i % 4) + "and then" for i in range(10)]
        want = [no_cache_engine.generate(p, GREEDY)["output_ids"] for p in prompts]
        got = [eng.generate(p, GREEDY)["output_ids"] for p in prompts]
        got += [r["output_ids"] for r in eng.generate(prompts[:3], GREEDY)]
        assert got == want + want[:3]
        stats = eng.get_stats()
        assert stats["kv_used"] <= stats["kv_capacity"]
        assert eng.flush_cache() and eng.get_stats()["kv_used"] == 0
    finally:
        eng.shutdown()
