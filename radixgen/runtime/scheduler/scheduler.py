"""Scheduler: continuous batching over the radix cache, in its own thread.

Every step admits new requests (continuous batching, `admission.py`), mixes prefill chunks and
decodes in one batch, launches it on the worker, and processes results (`output.py`). The KV
manager (`kv_manager.py`) alone changes KV state; building a batch (`batch.py`) is pure.

Overlap schedule: batch N+1 is scheduled and launched on the worker before batch N's results are
processed, so the forward pass of N+1 runs while this thread detokenizes, checks stop conditions,
streams and updates the tree for N. A decode input of N+1 that N has not produced yet is a
placeholder the worker resolves from N's sampled ids. N+1 samples only after this thread has
processed N (the batch's `ready` event), so penalties, seeds and grammar bitmasks see every token.
A request that turns out to have finished at N wastes its N+1 slot, which is freed afterwards.

Speculative decoding (`speculative_algorithm="ngram"`): the speculator (`speculator.py`) gives some
rows drafts, verified in the same forward (`batch.py`, `executor/sampling_rows.py`). How many drafts
a row keeps is known only once its result is processed, after the next batch is built: the request
either sits that batch out (`hold`) or is decoded in it as if all its drafts are accepted, a row
discarded like a jump-forward's stale one when they are not. The KV of rejected drafts (and of a
stale row) is freed once nothing of the request is in flight.

The worker is injected (anything with `submit(batch) -> Future[StepOutput]`), so the scheduler
runs against a fake in unit tests; with `start=False` the caller drives it with `step()`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.scheduler.admission import Admission
from radixgen.runtime.scheduler.batch import ScheduledBatch, StepOutput
from radixgen.runtime.scheduler.kv_manager import KVManager
from radixgen.runtime.scheduler.metrics import SchedulerMetrics
from radixgen.runtime.scheduler.output import OutputProcessor
from radixgen.runtime.scheduler.request import FinishReason, Req
from radixgen.runtime.scheduler.speculator import Speculator
from radixgen.runtime.threads import serial_torch_on_this_thread

logger = logging.getLogger(__name__)


class Worker(Protocol):
    """What the scheduler needs from the model side."""

    busy_seconds: float
    fast_decode_rows: int | None
    """Most rows of a pure-decode step that keep the model's fastest path (None: no such limit)."""

    def submit(self, batch: ScheduledBatch) -> Future[StepOutput]: ...

    def shutdown(self) -> None: ...


@dataclass
class _Control:
    """A request to the scheduler thread that is not a generation request."""

    op: str
    arg: object = None
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None


class Scheduler:
    """Owns the waiting/running queues and the step loop."""

    def __init__(self, config: EngineConfig, worker: Worker, kv: KVManager, context_length: int,
                 eos_token_ids: set[int], start: bool = True) -> None:
        self.config = config
        self.worker = worker
        self.kv = kv
        self.metrics = SchedulerMetrics()
        self.admission = Admission(config, kv, self.metrics)
        self.speculator = None
        if config.speculative_algorithm == "ngram":
            self.speculator = Speculator(
                config.speculative_num_draft_tokens, config.speculative_ngram_min_match_window_size,
                config.speculative_ngram_max_match_window_size, context_length,
                worker.fast_decode_rows, config.device.split(":")[0],
                overlap=not config.disable_overlap, metrics=self.metrics)
        self._busy_seen = 0.0  # the worker's busy seconds when the last step landed (step timing)
        self._ready_at: float | None = None  # when the worker's latest result was ready (idle gaps)
        self.output = OutputProcessor(kv, self.metrics, eos_token_ids, context_length,
                                      jump_forward=not config.disable_jump_forward, speculator=self.speculator)
        self.inbox: queue.Queue[Req | _Control] = queue.Queue()
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self._inflight: tuple[ScheduledBatch, Future[StepOutput]] | None = None
        self._stop = False
        self._ended = False  # the loop has returned: what is queued from now on is answered by _put
        self.error: Exception | None = None  # what stopped the loop, if an internal error did
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._loop, name="radixgen-scheduler", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ API (any thread)

    def add_request(self, req: Req) -> None:
        self._put(req)

    def abort(self, rid: str) -> None:
        self._put(_Control("abort", rid), check=False)  # nothing to abort once the loop has failed

    def call(self, op: str, arg: object = None, timeout: float | None = None) -> object:
        """Run a control op ("flush_cache", "stats") on the scheduler thread and wait for it."""
        c = _Control(op, arg)
        self._put(c)
        if not c.done.wait(timeout):
            raise TimeoutError(f"scheduler did not answer {op!r}")
        if isinstance(c.result, Exception):
            raise c.result
        return c.result

    def _error_message(self) -> str:
        return f"the engine stopped after an internal error ({self.error!r}); start a new Engine"

    def _end_message(self) -> str:
        return "engine shut down" if self.error is None else self._error_message()

    def _put(self, item: Req | _Control, check: bool = True) -> None:
        """Queue `item` for the loop; once the loop has failed, raise (`check`) or answer it here.

        A request can pass the engine's shut-down check and be queued after the loop's last look at
        the inbox (a program thread generating while the user's thread calls `shutdown()`): whichever
        of the loop and this caller sees the other's write answers it, so no caller waits forever."""
        if check and self.error is not None:
            raise RuntimeError(self._error_message())
        self.inbox.put(item)
        if self._ended:  # the loop ended while this was being queued
            self._answer_inbox()

    def _answer_inbox(self) -> None:
        """Answer everything still queued once the loop has ended: requests finish with "abort",
        control calls get an error (the internal error's, or "engine shut down")."""
        message = self._end_message()
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Req):
                item.finished = FinishReason("abort", message=message)
                item.emit({"text": "", "output_ids": [], "meta_info": item.meta_info()})
            else:
                item.result = RuntimeError(message)
                item.done.set()

    def shutdown(self) -> None:
        self._stop = True
        self.inbox.put(_Control("stop"))
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.worker.shutdown()

    # ------------------------------------------------------------------ loop

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self._inflight)

    def _loop(self) -> None:
        serial_torch_on_this_thread()  # no OpenMP team here beside the worker's (see runtime/threads.py)
        try:
            while not self._stop:
                self.step(block=not self.busy)
            self._land_inflight()
        except Exception as e:  # a bug must not hang callers: fail everything in flight and everything later
            self.error = e
            for req in self.running + self.waiting:
                self._finish(req, FinishReason("abort", message=f"internal error: {e!r}"))
            logger.exception("the scheduler stopped after an internal error")
        else:
            for req in self.running + self.waiting:
                self._finish(req, FinishReason("abort", message="engine shut down"))
        self._ended = True  # before the last look at the inbox: see _put
        self._answer_inbox()

    def step(self, block: bool = False) -> None:
        """One iteration: take new requests, launch the next batch, process the previous one."""
        self._drain(block)
        if self._stop:
            return
        batch = self._schedule(can_retract=self._inflight is None)
        timed = batch is not None and self.speculator is not None and self.speculator.costs.learn
        if timed and self._inflight is None:
            self._time_gap(batch)
        future = self.worker.submit(batch) if batch is not None else None
        if timed:
            future.add_done_callback(lambda _, b=batch: self._stamp(b))
        landed = self._inflight is not None
        self._land_inflight()
        if batch is None:
            if (self.waiting or self.running) and not landed:
                time.sleep(0.001)  # nothing fits yet (KV held by running requests)
        else:
            batch.ready.set()  # the results before this batch are in: it may sample now
            if self.config.disable_overlap:
                self._process(batch, future.result())
            else:
                self._inflight = (batch, future)
        if self.config.debug_kv_check:
            self.kv.check(self.running + self.waiting)

    def _land_inflight(self) -> None:
        if self._inflight is not None:
            batch, future = self._inflight
            self._inflight = None
            self._process(batch, future.result())

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, Req):
                self.waiting.append(item)
                self.metrics.on_arrival()
            else:
                self._control(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _control(self, c: _Control) -> None:
        try:
            if c.op == "abort":
                for req in self.waiting + self.running:
                    if req.rid == c.arg:
                        req.to_abort = "aborted by client"
            elif c.op == "flush_cache":
                c.result = self._flush_cache()
            elif c.op == "stats":
                c.result = self.stats()
            elif c.op == "stop":
                self._stop = True
        except Exception as e:  # report to the caller
            c.result = e
        c.done.set()

    def _flush_cache(self) -> bool:
        if self.running or self.waiting:  # a finished request stays in running until its KV is released
            return False
        self.kv.flush()
        return True

    def stats(self) -> dict:
        return self.metrics.snapshot(
            running=len(self.running),
            waiting=len(self.waiting),
            kv_used=self.kv.used(),
            kv_capacity=self.kv.capacity,
            kv_evictable=self.kv.evictable(),
            worker_busy_seconds=self.worker.busy_seconds,
        )

    # ------------------------------------------------------------------ a step

    def _schedule(self, can_retract: bool) -> ScheduledBatch | None:
        """Pick and lay out this step's batch; None when nothing can run yet."""
        for req in self.waiting + self.running:
            if req.finished is None and req.seq_len > self.kv.capacity:  # retracted, it could never resume
                req.to_abort = f"KV cache exhausted: the sequence ({req.seq_len} tokens) outgrew the KV pool"
            if req.to_abort and not req.finished:
                self._finish(req, FinishReason("abort", message=req.to_abort))
        plan = self.admission.plan(self.running, self.waiting, can_retract)
        if plan is None:
            return None
        reqs, lens = plan
        proposal = None
        if self.speculator is not None:
            proposal = self.speculator.propose(reqs, lens, room=self.kv.free() - sum(lens))
            lens = [n + len(d) for n, d in zip(lens, proposal.drafts, strict=True)]
        allocated = self.kv.allocate(reqs, lens)
        if allocated is None:  # a lone request larger than the whole pool
            self._finish(reqs[0], FinishReason("abort", message="KV cache exhausted"))
            return None
        loc, starts = allocated
        batch = ScheduledBatch.build(reqs, lens, starts, loc, self.kv.take_table_update(),
                                     self.kv.req_pool.device_table.device, *(
                                         (proposal.drafts, proposal.hold) if proposal else ()))
        for i, req in enumerate(reqs):
            req.flight.launch(batch.samples[i], batch.sample_refs[i], len(batch.drafts[i]), batch.hold[i])
        return batch

    def _process(self, batch: ScheduledBatch, out: StepOutput) -> None:
        now = time.perf_counter()
        if self.speculator is not None and self.speculator.costs.learn:
            self._time_step(batch)
        for i, req in enumerate(batch.reqs):
            req.flight.land(batch.samples[i], len(batch.drafts[i]), batch.hold[i])
            self.kv.computed(req, batch.extend_lens[i])
            if req.finished is not None:  # finished at an earlier batch: this step was wasted
                if req.flight.idle:
                    self._release(req)
                continue
            if req.flight.skip:  # its inputs were replaced by a jump-forward
                req.flight.skip -= 1
                if req.flight.idle:
                    self.kv.apply_truncate(req)
                continue
            done = self.output.on_result(req, batch, i, out, now)
            if done is not None:
                self._finish(req, *done)
        self.metrics.prompt_tokens += batch.prefill_tokens
        self.metrics.forward_steps += 1

    def _stamp(self, batch: ScheduledBatch) -> None:
        """The batch's result is ready (on the thread that set it, before the worker starts another
        batch): note the worker's busy seconds so far."""
        batch.worker_busy = self.worker.busy_seconds
        self._ready_at = time.perf_counter()

    def _time_gap(self, batch: ScheduledBatch) -> None:
        """A pure-decode batch launched with nothing in flight (its requests waited for the last result,
        as a request holding for its drafts' verification does): the worker sat idle from that result
        to now, which the speculator weighs against running on."""
        if self._ready_at is not None and all(n - len(d) == 1 for n, d in zip(batch.extend_lens, batch.drafts,
                                                                              strict=True)):
            self.speculator.on_gap(time.perf_counter() - self._ready_at)

    def _time_step(self, batch: ScheduledBatch) -> None:
        """Give the speculator's cost model the worker's time for a landed pure-decode step (its busy
        seconds since the previous batch's result: the worker runs batches one after another)."""
        if batch.worker_busy is None:
            return
        seconds, self._busy_seen = batch.worker_busy - self._busy_seen, batch.worker_busy
        if all(n - len(d) == 1 for n, d in zip(batch.extend_lens, batch.drafts, strict=True)):
            grammar_rows = sum(len(d) for r, d in zip(batch.reqs, batch.drafts, strict=True) if r.grammar is not None)
            self.speculator.on_step(len(batch.reqs), sum(batch.extend_lens), grammar_rows, seconds)

    def _release(self, req: Req) -> None:
        """A finished request leaves the running queue; its KV goes to the tree."""
        if req in self.running:
            self.running.remove(req)
        self.kv.release(req)

    def _finish(self, req: Req, reason: FinishReason, delta: str = "") -> None:
        req.finished = reason
        if req in self.waiting:
            self.waiting.remove(req)
        if req.flight.idle:  # else released once its last in-flight batch is processed
            self._release(req)
        self.metrics.on_finish()
        self.output.emit_final(req, delta)
