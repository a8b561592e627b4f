"""Compiled-grammar cache with asynchronous, deadline-bounded, fair compilation.

A request asks `get_or_compile(spec)` and gets a Future at once; the compile runs on a small pool
of threads, so a slow compile (a big schema, an outlines index) never blocks the scheduling loop:
the request waits (not scheduled) until its Future is done.

- Keyed by `ConstraintSpec` (kind, canonical spec, whitespace mode); LRU-bounded by entry count.
  Concurrent identical requests share one compile, so a spec is compiled once.
- Each caller gets its own Future (a ticket). Cancelling it (asyncio cancels a `wrap_future`'d
  ticket when the request's task is cancelled, e.g. on a client disconnect) withdraws that caller; a
  queued compile nobody waits for any more is dropped, and a running one gives its thread slot back
  (its result is still cached if it finishes, since threads cannot be interrupted).
- Deadline: a compile still running `timeout` seconds after it started fails its waiters with
  `CompileTimeout` (a GrammarError naming the limit); a request for the same spec while that
  compile still runs fails at once with the same error. The slot is given back so other compiles
  go on; at most `max_workers` such abandoned compiles run at a time. A compile that waited twice
  `timeout` in the queue without starting fails with `CompilerBusy` (the pool is overloaded).
- Fairness: queued compiles are taken round-robin across clients (the `compile_client` context
  variable, set per request by the server), and one client never holds more than `max_workers - 1`
  threads (1 with a single thread), so one client's slow schemas cannot starve another's.
- Failures are not cached: every waiter of a failing compile gets that same `GrammarError`; a later
  request compiles again. Errors that are not `GrammarError` (a backend bug, out of memory) are
  wrapped in one naming the spec.
- Exit: at interpreter exit the cache shuts down and waits (up to the deadline) for the compiles still
  running, so no thread is inside a backend's native code when Python finalizes (common/exit_hooks.py).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from contextvars import ContextVar
from dataclasses import dataclass, field

from radixgen.common.exit_hooks import COMPILERS, at_exit
from radixgen.grammar.base import CompiledGrammar, ConstraintSpec, GrammarBackend, GrammarError

compile_client: ContextVar[str | None] = ContextVar("radixgen_compile_client", default=None)
"""Who is asking for a compile (the server sets it per request); compiles are shared fairly among clients."""


class CompileTimeout(GrammarError):
    """A constraint whose compile ran past the deadline (too complex for this server)."""


class CompilerBusy(GrammarError):
    """No compile thread became free for a constraint within the deadline (the server is overloaded)."""


@dataclass(eq=False)
class _Job:
    spec: ConstraintSpec
    client: str
    queued_at: float
    tickets: set[Future] = field(default_factory=set)
    started_at: float | None = None
    holds_slot: bool = False
    error: GrammarError | None = None  # set when the deadline passed: later askers get it at once


def _resolve(ticket: Future, result: CompiledGrammar | None, error: BaseException | None) -> None:
    try:
        if error is not None:
            ticket.set_exception(error)
        else:
            ticket.set_result(result)
    except InvalidStateError:  # cancelled meanwhile
        pass


class GrammarCache:
    """Asynchronous, deduplicating, LRU-bounded cache of compiled grammars for one backend."""

    def __init__(self, backend: GrammarBackend, max_workers: int = 2, max_entries: int = 1024,
                 timeout: float | None = 30.0, on_compiled: Callable[[float], None] | None = None) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.backend = backend
        self.on_compiled = on_compiled  # told each compile's duration in seconds (metrics)
        self.max_entries = max_entries
        self.max_workers = max_workers
        self.timeout = timeout
        self.per_client = max(1, max_workers - 1)
        self._cond = threading.Condition()
        self._entries: OrderedDict[ConstraintSpec, Future[CompiledGrammar]] = OrderedDict()  # finished
        self._jobs: dict[ConstraintSpec, _Job] = {}  # queued or running
        self._queues: dict[str, deque[_Job]] = {}
        self._turns: deque[str] = deque()  # clients with queued jobs, round-robin order
        self._running: dict[str, int] = {}  # slots held per client
        self._workers = 0  # threads holding (or waiting for) a slot
        self._abandoned = 0  # threads still running a compile past its deadline or its waiters
        self._threads: set[threading.Thread] = set()  # compile threads alive (abandoned ones included)
        self._closed = False
        self.compiles = 0  # compiles started (misses)
        self.hits = 0
        self.timeouts = 0
        self._watch = threading.Thread(target=self._watchdog, name="grammar-deadline", daemon=True)
        self._watch.start()
        at_exit(self._close_at_exit, COMPILERS, weak=True)

    # ------------------------------------------------------------------ API

    def get_or_compile(self, spec: ConstraintSpec) -> Future[CompiledGrammar]:
        """A Future of the compiled grammar (done at once on a hit to a finished compile); cancel it to
        withdraw. Compiles for the client in `compile_client` share the threads fairly with others."""
        ticket: Future[CompiledGrammar] = Future()
        with self._cond:
            done = self._entries.get(spec)
            if done is not None:
                self._entries.move_to_end(spec)
                self.hits += 1
                return done
            if self._closed:
                ticket.set_exception(GrammarError("grammar compiler is shut down"))
                return ticket
            job = self._jobs.get(spec)
            if job is not None and job.error is not None:
                ticket.set_exception(job.error)
                return ticket
            if job is None:
                job = _Job(spec, compile_client.get() or "", time.monotonic())
                self._jobs[spec] = job
                self._enqueue_locked(job)
                self.compiles += 1
            else:
                self.hits += 1
            job.tickets.add(ticket)
        ticket.add_done_callback(lambda t: self._withdraw(job, t) if t.cancelled() else None)
        return ticket

    def compile_sync(self, spec: ConstraintSpec, timeout: float | None = None) -> CompiledGrammar:
        """Blocking convenience for tools and tests: `get_or_compile(spec).result(timeout)`."""
        return self.get_or_compile(spec).result(timeout)

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries) + len(self._jobs)

    def __contains__(self, spec: ConstraintSpec) -> bool:
        with self._cond:
            return spec in self._entries or spec in self._jobs

    def clear(self) -> None:
        """Forget all finished entries (pending compiles still complete for their waiters)."""
        with self._cond:
            self._entries.clear()

    def shutdown(self, wait: bool = True) -> None:
        """Stop: queued compiles fail with GrammarError; with `wait`, running ones finish first."""
        with self._cond:
            self._closed = True
            dropped = [job for q in self._queues.values() for job in q]
            self._queues.clear()
            self._turns.clear()
            for job in dropped:
                self._jobs.pop(job.spec, None)
            self._cond.notify_all()
        error = GrammarError("grammar compiler is shut down")
        for job in dropped:
            for t in list(job.tickets):
                _resolve(t, None, error)
        if wait:
            with self._cond:
                self._cond.wait_for(lambda: self._workers == 0 and not self._jobs, timeout=60)

    def _close_at_exit(self) -> None:
        """Shut down and join every compile thread, those running an abandoned compile included (for
        at most the compile deadline, 60 s without one)."""
        self.shutdown(wait=False)
        deadline = time.monotonic() + (self.timeout or 60.0)
        with self._cond:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))

    # ------------------------------------------------------------------ queue (lock held)

    def _enqueue_locked(self, job: _Job) -> None:
        q = self._queues.get(job.client)
        if q is None:
            q = self._queues[job.client] = deque()
            self._turns.append(job.client)
        q.append(job)
        self._spawn_if_needed_locked()
        self._cond.notify_all()

    def _take_locked(self) -> _Job | None:
        """The next queued job, round-robin across clients under their slot limit."""
        for _ in range(len(self._turns)):
            client = self._turns[0]
            self._turns.rotate(-1)
            if self._running.get(client, 0) >= self.per_client:
                continue
            q = self._queues[client]
            job = q.popleft()
            if not q:
                del self._queues[client]
                self._turns.remove(client)
            return job
        return None

    def _unqueue_locked(self, job: _Job) -> None:
        q = self._queues.get(job.client)
        if q is not None and job in q:
            q.remove(job)
            if not q:
                del self._queues[job.client]
                self._turns.remove(job.client)
        self._jobs.pop(job.spec, None)

    def _give_back_slot_locked(self, job: _Job) -> None:
        """The job's thread stops counting as a worker (it finishes its compile, then exits)."""
        job.holds_slot = False
        self._running[job.client] -= 1
        self._workers -= 1
        self._abandoned += 1
        self._spawn_if_needed_locked()
        self._cond.notify_all()

    def _spawn_if_needed_locked(self) -> None:
        """Start a worker when compiles are queued and a slot is free (abandoned compiles capped)."""
        if self._queues and self._workers < self.max_workers and self._abandoned <= self.max_workers \
                and not self._closed:
            self._workers += 1
            thread = threading.Thread(target=self._worker, name="grammar-compile", daemon=True)
            self._threads.add(thread)
            thread.start()

    # ------------------------------------------------------------------ threads

    def _worker(self) -> None:
        try:
            self._work()
        finally:
            with self._cond:
                self._threads.discard(threading.current_thread())

    def _work(self) -> None:
        while True:
            with self._cond:
                job = self._take_locked()
                while job is None:
                    if self._closed:
                        self._workers -= 1
                        self._cond.notify_all()
                        return
                    self._cond.wait()
                    job = self._take_locked()
                job.started_at = time.monotonic()
                job.holds_slot = True
                self._running[job.client] = self._running.get(job.client, 0) + 1
                self._cond.notify_all()  # the watchdog now has a running deadline
            result, error = self._compile(job.spec)
            with self._cond:
                held = job.holds_slot
                if held:
                    job.holds_slot = False
                    self._running[job.client] -= 1
                else:
                    self._abandoned -= 1
                    self._spawn_if_needed_locked()
                if self._jobs.get(job.spec) is job:
                    del self._jobs[job.spec]
                if error is None:
                    done: Future[CompiledGrammar] = Future()
                    done.set_result(result)
                    self._entries[job.spec] = done
                    self._evict_locked()
                tickets = list(job.tickets) if job.error is None else []
                self._cond.notify_all()
            for t in tickets:
                _resolve(t, result, error)
            if not held:
                return  # this thread gave its slot away when the job was abandoned

    def _compile(self, spec: ConstraintSpec) -> tuple[CompiledGrammar | None, GrammarError | None]:
        start = time.perf_counter()
        try:
            return self.backend.compile(spec), None
        except BaseException as e:  # reported to the waiters, never raised on this thread
            if isinstance(e, GrammarError):
                return None, e
            err = GrammarError(f"compiling {spec.short()} failed: {type(e).__name__}: {e}")
            err.__cause__ = e
            return None, err
        finally:
            if self.on_compiled is not None:
                self.on_compiled(time.perf_counter() - start)

    def _watchdog(self) -> None:
        """Fail jobs past their deadline: running ones with CompileTimeout, queued ones with CompilerBusy."""
        while True:
            expired: list[tuple[list[Future], GrammarError]] = []
            with self._cond:
                if self._closed and not self._jobs:
                    return
                now = time.monotonic()
                wake = None
                if self.timeout is not None:
                    for job in list(self._jobs.values()):
                        if job.error is not None:
                            continue
                        # running: `timeout` from its start; queued: twice that from its arrival
                        due = job.started_at + self.timeout if job.started_at is not None \
                            else job.queued_at + 2 * self.timeout
                        if now < due:
                            wake = due if wake is None else min(wake, due)
                            continue
                        expired.append((list(job.tickets), self._expire_locked(job)))
                if not expired:
                    self._cond.wait(None if wake is None else max(wake - now, 0.01))
            for tickets, error in expired:
                for t in tickets:
                    _resolve(t, None, error)

    def _expire_locked(self, job: _Job) -> GrammarError:
        if job.started_at is None:
            self._unqueue_locked(job)
            return CompilerBusy(f"the grammar compiler is busy: {job.spec.kind} constraint waited "
                                f"{2 * self.timeout:g} s for one of {self.max_workers} compile threads; retry later")
        self.timeouts += 1
        job.error = CompileTimeout(
            f"compiling this {job.spec.kind} constraint did not finish within {self.timeout:g} s "
            "(the grammar compile deadline, --grammar-compile-timeout): simplify it (less nesting, fewer "
            "optional properties, smaller repetition counts)")
        if job.holds_slot:
            self._give_back_slot_locked(job)
        return job.error

    def _withdraw(self, job: _Job, ticket: Future) -> None:
        """A waiter cancelled its ticket: drop a queued compile nobody wants, free a running one's slot."""
        with self._cond:
            job.tickets.discard(ticket)
            if job.tickets or self._jobs.get(job.spec) is not job:
                return
            if job.started_at is None:
                self._unqueue_locked(job)
            elif job.holds_slot:
                self._give_back_slot_locked(job)

    def _evict_locked(self) -> None:
        """Drop least recently used finished entries beyond `max_entries`."""
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
