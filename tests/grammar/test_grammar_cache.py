"""GrammarCache: asynchronous, deduplicated compiles; failures propagate and are not cached."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from radixgen.grammar import CompiledGrammar, ConstraintSpec, GrammarBackend, GrammarCache, GrammarError, regex_spec


class CountingBackend(GrammarBackend):
    """A fake backend: counts compiles, can block on an event, fails on demand."""

    name = "fake"
    vocab_size = 64

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[ConstraintSpec] = []
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        with self.lock:
            self.calls.append(spec)
        self.gate.wait(5)
        time.sleep(self.delay)
        if spec.spec == "bad":
            raise GrammarError("invalid regex constraint: bad")
        if spec.spec == "crash":
            raise RuntimeError("boom")
        return CompiledGrammar(spec, self.name, handle=object())

    def matcher(self, compiled):  # pragma: no cover - not used here
        raise NotImplementedError


def test_identical_concurrent_requests_compile_once():
    backend = CountingBackend(delay=0.05)
    cache = GrammarCache(backend, max_workers=2)
    spec = regex_spec("[0-9]+")
    with ThreadPoolExecutor(8) as pool:
        futures = list(pool.map(lambda _: cache.get_or_compile(ConstraintSpec("regex", "[0-9]+")), range(16)))
    results = {id(f.result(5)) for f in futures}
    assert len(backend.calls) == 1 and len(results) == 1
    assert cache.compiles == 1 and cache.hits == 15
    assert cache.get_or_compile(spec).done()  # a hit on a finished compile is immediate
    cache.get_or_compile(regex_spec("[a-z]+")).result(5)
    assert len(backend.calls) == 2
    cache.shutdown()


def test_compile_does_not_block_the_caller():
    backend = CountingBackend()
    backend.gate.clear()
    cache = GrammarCache(backend)
    t0 = time.perf_counter()
    fut = cache.get_or_compile(regex_spec("a"))
    assert time.perf_counter() - t0 < 0.5 and not fut.done()
    backend.gate.set()
    assert fut.result(5).spec == regex_spec("a")
    cache.shutdown()


def test_failures_propagate_and_are_retried():
    backend = CountingBackend()
    cache = GrammarCache(backend)
    f1 = cache.get_or_compile(ConstraintSpec("regex", "bad"))
    with pytest.raises(GrammarError, match="bad"):
        f1.result(5)
    assert ConstraintSpec("regex", "bad") not in cache  # not cached
    with pytest.raises(GrammarError, match="bad"):
        cache.compile_sync(ConstraintSpec("regex", "bad"), timeout=5)
    assert len(backend.calls) == 2  # the second request compiled again
    with pytest.raises(GrammarError, match="regex:crash.*RuntimeError: boom"):
        cache.compile_sync(ConstraintSpec("regex", "crash"), timeout=5)
    cache.shutdown()
    with pytest.raises(GrammarError, match="shut down"):
        cache.compile_sync(regex_spec("z"), timeout=5)


def test_waiters_of_a_failing_compile_share_its_error():
    backend = CountingBackend()
    backend.gate.clear()
    cache = GrammarCache(backend)
    futures = [cache.get_or_compile(ConstraintSpec("regex", "bad")) for _ in range(3)]
    backend.gate.set()
    errors = {id(f.exception(5)) for f in futures}
    assert len(errors) == 1 and len(backend.calls) == 1
    cache.shutdown()


def test_lru_bound():
    cache = GrammarCache(CountingBackend(), max_entries=2)
    for p in ("a", "b", "c", "d"):
        cache.compile_sync(regex_spec(p), timeout=5)
    assert len(cache) <= 2 and regex_spec("d") in cache
    cache.clear()
    assert len(cache) == 0
    cache.shutdown()


def test_with_xgrammar(xgr_backend):
    cache = GrammarCache(xgr_backend)
    a = cache.compile_sync(regex_spec("[0-9]{3}"), timeout=30)
    b = cache.compile_sync(regex_spec("[0-9]{3}"), timeout=30)
    assert a is b and a.backend == "xgrammar" and cache.compiles == 1
    with pytest.raises(GrammarError, match="regex"):
        cache.compile_sync(regex_spec("[0-9"), timeout=30)
    cache.shutdown()
