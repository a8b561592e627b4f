"""An Engine is a library object: it leaves process-wide state to the program that owns the process.

Two engines share one process (as two models in one application, or an engine inside a user's
server that froze its own heap); shutting one down must neither stop the other nor undo the
application's garbage-collector settings. `radixgen serve` owns its process and freezes its start-up
heap itself (server/memory.py's freeze_startup_heap).
"""

from __future__ import annotations

import gc

from radixgen.runtime.engine import Engine

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
PROMPT = [5, 6, 7, 8]


def _frozen_by_the_library(before: int) -> bool:
    """Whether the permanent generation grew: a gc.freeze() after building an engine moves its ~100k
    new objects there (frozen objects that are freed leave it, so it may shrink a little by itself)."""
    return gc.get_freeze_count() > before


def _unfrozen_by_the_library(before: int) -> bool:
    """Whether the application's frozen heap was given back to the collector (gc.unfreeze empties it)."""
    return gc.get_freeze_count() < before // 2


def test_two_engines_one_shut_down_the_other_serves_and_gc_state_is_left_alone(tiny_models):
    path = str(tiny_models["llama"])
    gc.collect()
    gc.freeze()  # the embedding application keeps its start-up heap out of the collector
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        first = Engine(path, max_total_tokens=256)
        second = Engine(path, max_total_tokens=256)
        try:
            assert not _frozen_by_the_library(frozen)
            expected = second.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"]
            assert first.generate(input_ids=PROMPT, sampling_params=GREEDY)["output_ids"] == expected
            first.shutdown()
            assert not _unfrozen_by_the_library(frozen) and not _frozen_by_the_library(frozen)
            out = second.generate(input_ids=PROMPT, sampling_params=GREEDY)
            assert out["output_ids"] == expected and out["meta_info"]["finish_reason"]["type"] == "length"
            streamed = [c["output_ids"] for c in second.generate(input_ids=PROMPT, sampling_params=GREEDY,
                                                                  stream=True)]
            assert sum(streamed, []) == expected
        finally:
            first.shutdown()
            second.shutdown()
        assert not _unfrozen_by_the_library(frozen) and not _frozen_by_the_library(frozen)
    finally:
        gc.unfreeze()


def test_an_engine_leaves_the_gc_unfrozen(tiny_models):
    """Without an application freeze, neither start-up nor shutdown moves anything out of the collector."""
    assert gc.get_freeze_count() == 0
    with Engine(str(tiny_models["llama"]), max_total_tokens=256) as eng:
        assert gc.get_freeze_count() == 0
        eng.generate(input_ids=PROMPT, sampling_params=GREEDY)
    assert gc.get_freeze_count() == 0
