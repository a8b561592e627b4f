"""GrammarCache: asynchronous, deduplicated compiles; failures propagate and are not cached; a deadline per
compile, cancellation when nobody waits, and fairness across clients."""

from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from radixgen.grammar import (
    CompiledGrammar,
    ConstraintSpec,
    GrammarBackend,
    GrammarCache,
    GrammarError,
    json_schema_spec,
    regex_spec,
)
from radixgen.grammar.compiler_cache import CompilerBusy, CompileTimeout, compile_client


class CountingBackend(GrammarBackend):
    """A fake backend: counts compiles, can block on an event, fails on demand."""

    name = "fake"
    vocab_size = 64

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[ConstraintSpec] = []
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        with self.lock:
            self.calls.append(spec)
        self.gate.wait(5)
        if spec.spec.startswith("slow"):  # blocks until released (a compile that will not finish in time)
            self.release.wait(10)
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


def _ask(cache: GrammarCache, spec: ConstraintSpec, client: str):
    """`get_or_compile` as a request of `client` (the server sets the context variable per request)."""
    ctx = contextvars.copy_context()
    ctx.run(compile_client.set, client)
    return ctx.run(cache.get_or_compile, spec)


def test_deadline_fails_waiters_and_frees_the_thread():
    backend = CountingBackend()
    cache = GrammarCache(backend, max_workers=1, timeout=0.3)
    slow = ConstraintSpec("regex", "slow1")
    t0 = time.perf_counter()
    f1 = cache.get_or_compile(slow)
    other = cache.get_or_compile(regex_spec("b"))  # queued behind the slow one on the only thread
    with pytest.raises(CompileTimeout, match=r"within 0.3 s .*--grammar-compile-timeout"):
        f1.result(5)
    assert 0.25 < time.perf_counter() - t0 < 2
    assert other.result(5).spec == regex_spec("b")  # the slot was given back while the slow one still runs
    again = cache.get_or_compile(slow)  # same spec while the abandoned compile runs: the same error at once
    assert again.done() and again.exception() is f1.exception()
    backend.release.set()  # the abandoned compile finishes: its result is cached for later requests
    deadline = time.monotonic() + 5
    while slow not in cache._entries and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cache.get_or_compile(slow).result(0).spec == slow and cache.timeouts == 1
    cache.shutdown()


def test_queue_wait_past_the_deadline_is_busy():
    backend = CountingBackend()
    cache = GrammarCache(backend, max_workers=1, timeout=0.3)
    stuck = [cache.get_or_compile(ConstraintSpec("regex", f"slow{i}")) for i in range(2)]
    waiting = cache.get_or_compile(regex_spec("c"))
    # slow0 times out (one abandoned compile is allowed: a new thread takes slow1), slow1 times out too
    # (two abandoned > 1 thread: no new thread), so "c" waits its whole deadline in the queue
    for f in stuck:
        with pytest.raises(CompileTimeout):
            f.result(5)
    with pytest.raises(CompilerBusy, match="busy"):
        waiting.result(5)
    backend.release.set()
    cache.shutdown()


def test_cancelled_waiters_withdraw_their_compiles():
    backend = CountingBackend()
    cache = GrammarCache(backend, max_workers=1, timeout=None)
    running = cache.get_or_compile(ConstraintSpec("regex", "slow-a"))
    queued = cache.get_or_compile(regex_spec("never"))
    nxt = cache.get_or_compile(regex_spec("next"))
    time.sleep(0.1)
    assert queued.cancel()  # nobody waits for "never" any more: it is dropped without compiling
    assert regex_spec("never") not in cache
    assert running.cancel()  # the running compile's only waiter left: its thread slot goes to "next"
    assert nxt.result(5).spec == regex_spec("next")
    backend.release.set()
    cache.shutdown()
    assert [s.spec for s in backend.calls] == ["slow-a", "next"]


def test_one_client_cannot_starve_another():
    backend = CountingBackend(delay=0.2)
    cache = GrammarCache(backend, max_workers=2, timeout=None)
    flood = [_ask(cache, regex_spec(f"a{i}"), "client-a") for i in range(6)]
    time.sleep(0.05)
    t0 = time.perf_counter()
    mine = _ask(cache, regex_spec("b0"), "client-b")
    mine.result(5)
    waited = time.perf_counter() - t0
    assert waited < 0.5, waited  # client b got the thread client a may not take: one compile, not six
    assert sum(f.done() for f in flood) <= 2
    for f in flood:
        f.result(10)
    cache.shutdown()


def test_with_xgrammar_deadline(xgr_backend):
    """A schema nested 256 deep takes over a second in XGrammar: a 0.2 s deadline fails it, and a small
    schema asked meanwhile by another client still compiles."""
    deep: dict = {"type": "string"}
    for _ in range(256):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    cache = GrammarCache(xgr_backend, max_workers=2, timeout=0.2)
    slow = _ask(cache, json_schema_spec(deep), "client-a")
    small = _ask(cache, json_schema_spec({"type": "integer"}), "client-b")
    assert small.result(30).backend == "xgrammar"
    with pytest.raises(CompileTimeout, match="json_schema"):
        slow.result(30)
    cache.shutdown(wait=True)  # the abandoned compile runs on in C++: let it end before the process does
