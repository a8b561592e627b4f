"""Compiled-grammar cache with asynchronous compilation.

The scheduler asks `get_or_compile(spec)` when a constrained request arrives and gets a Future at
once; the compile runs on a small thread pool, so a slow compile (a big schema, an outlines index)
never blocks the scheduling loop: the request waits (not scheduled) until its Future is done.

- Keyed by `ConstraintSpec` (kind, canonical spec, whitespace mode); LRU-bounded by entry count.
- Concurrent identical requests share one Future, so a spec is compiled once.
- Failures are not cached: every request that arrived while the failing compile was in flight gets
  that same `GrammarError`; the entry is then dropped, so a later request compiles again (and, for
  a deterministic input error, fails again with the same message). Errors that are not
  `GrammarError` (a backend bug, out of memory) are wrapped in one naming the spec.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from radixgen.grammar.base import CompiledGrammar, ConstraintSpec, GrammarBackend, GrammarError


class GrammarCache:
    """Asynchronous, deduplicating, LRU-bounded cache of compiled grammars for one backend."""

    def __init__(self, backend: GrammarBackend, max_workers: int = 1, max_entries: int = 1024,
                 on_compiled: Callable[[float], None] | None = None) -> None:
        self.backend = backend
        self.on_compiled = on_compiled  # told each compile's duration in seconds (metrics)
        self.max_entries = max_entries
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar-compile")
        self._lock = threading.Lock()
        self._entries: OrderedDict[ConstraintSpec, Future[CompiledGrammar]] = OrderedDict()
        self.compiles = 0  # compiles started (misses)
        self.hits = 0

    def get_or_compile(self, spec: ConstraintSpec) -> Future[CompiledGrammar]:
        """A Future of the compiled grammar; done at once on a hit to a finished compile."""
        with self._lock:
            fut = self._entries.get(spec)
            if fut is not None:
                self._entries.move_to_end(spec)
                self.hits += 1
                return fut
            fut = Future()
            fut.set_running_or_notify_cancel()
            self._entries[spec] = fut
            self.compiles += 1
            self._evict_locked()
        try:
            self._pool.submit(self._compile, spec, fut)
        except RuntimeError as e:  # the pool was shut down
            with self._lock:
                self._entries.pop(spec, None)
            fut.set_exception(GrammarError(f"grammar compiler is shut down: {e}"))
        return fut

    def compile_sync(self, spec: ConstraintSpec, timeout: float | None = None) -> CompiledGrammar:
        """Blocking convenience for tools and tests: `get_or_compile(spec).result(timeout)`."""
        return self.get_or_compile(spec).result(timeout)

    def _compile(self, spec: ConstraintSpec, fut: Future[CompiledGrammar]) -> None:
        start = time.perf_counter()
        try:
            result = self.backend.compile(spec)
        except BaseException as e:
            err = e if isinstance(e, GrammarError) else GrammarError(
                f"compiling {spec.short()} failed: {type(e).__name__}: {e}"
            )
            if err is not e:
                err.__cause__ = e
            with self._lock:
                if self._entries.get(spec) is fut:
                    del self._entries[spec]
            fut.set_exception(err)
            return
        finally:
            if self.on_compiled is not None:
                self.on_compiled(time.perf_counter() - start)
        fut.set_result(result)

    def _evict_locked(self) -> None:
        """Drop least recently used finished entries beyond `max_entries` (pending ones stay)."""
        if len(self._entries) <= self.max_entries:
            return
        for key in [k for k, f in self._entries.items() if f.done()]:
            if len(self._entries) <= self.max_entries:
                break
            del self._entries[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, spec: ConstraintSpec) -> bool:
        with self._lock:
            return spec in self._entries

    def clear(self) -> None:
        """Forget all finished entries (pending compiles still complete for their waiters)."""
        with self._lock:
            for key in [k for k, f in self._entries.items() if f.done()]:
                del self._entries[key]

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=False)
