"""Observer: one engine's metrics, request log, batch-stats log and traces, fed off the scheduler thread.

The engine calls `watch(req, compile_future)` for every request before submitting it. That wraps
the request's output channel: when its final chunk passes (on the scheduler thread) the request,
its final `meta_info` and the finish time are appended to a queue, and that is all the scheduler
thread pays. The observer's thread turns each into a `RequestRecord` for the Prometheus series,
the request log line and the span tree, and every `stats_log_interval` seconds reads
`get_stats()` to refresh the engine gauges and print the batch lines. `refresh()` does the same on
demand (GET /metrics calls it), after recording every request finished before the call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from radixgen.runtime.observability import tracing
from radixgen.runtime.observability.batch_log import BatchStatsLogger
from radixgen.runtime.observability.metrics import EngineMetrics
from radixgen.runtime.observability.records import RequestRecord
from radixgen.runtime.observability.request_log import RequestLogger

logger = logging.getLogger(__name__)
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"  # the served name of the default model


def served_model_name(model: str | None) -> str:
    """The name a model is served under by default: its path's last component (the default model's
    name when none is given)."""
    return str(model).rstrip("/").rsplit("/", 1)[-1] if model else DEFAULT_MODEL_NAME


class Observer:
    """Observability of one engine (see the module docstring). `config` is the EngineConfig."""

    def __init__(self, config: Any, tokenizer: Any, get_stats: Callable[[], dict], context_length: int) -> None:
        self.config = config
        self.get_stats = get_stats
        self.context_length = context_length
        self._dp_rank: int | None = None
        self.metrics = EngineMetrics(served_model_name(config.model))
        self.request_log = RequestLogger(tokenizer, config.log_requests, config.log_requests_level)
        self.batch_log = BatchStatsLogger()
        self._tracer_provider = tracing.setup(config.otlp_traces_endpoint)
        self._finished: deque[tuple] = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one recorder / publisher at a time
        self._stop = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="radixgen-observer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ labels

    def set_labels(self, model_name: str | None = None, dp_rank: int | None = None) -> None:
        """Label the series with the served `model_name` and, for a data-parallel replica, its
        `dp_rank`. Call before serving: the series start again under the new labels."""
        with self._lock:
            name = model_name or self.metrics.request_labels["model_name"]
            rank = dp_rank if dp_rank is not None else self._dp_rank
            if (name, rank) != (self.metrics.request_labels["model_name"], self._dp_rank):
                self.metrics, self._dp_rank = EngineMetrics(name, rank), rank

    # ------------------------------------------------------------------ requests (any thread)

    def watch(self, req: Any, compile_future: Future | None) -> None:
        """Follow `req` (not yet submitted) until it finishes; `compile_future` is its grammar compile."""
        grammar_wait: list[float | None] = [None]
        if compile_future is not None:
            hit = compile_future.done()
            self.metrics.observe_grammar_request(hit)
            if not hit:
                def compiled(_: Future) -> None:
                    grammar_wait[0] = time.perf_counter() - req.created

                compile_future.add_done_callback(compiled)
        parent = tracing.capture_context()
        keep_text = self.request_log.wants_output_text
        inner = req.emit

        def emit(chunk: dict) -> None:
            meta = chunk["meta_info"]
            if meta["finish_reason"] is not None:
                text = req.detok.output_text if keep_text else None
                self._finished.append((req, meta, time.time(), grammar_wait[0], parent, text))
                if self._closed:
                    self._drain()  # the observer thread has stopped (engine shutting down)
                else:
                    self._wake.set()
            inner(chunk)

        req.emit = emit

    def on_grammar_compiled(self, seconds: float) -> None:
        """The grammar cache finished one compile (called on its thread)."""
        self.metrics.observe_grammar_compile(seconds)

    # ------------------------------------------------------------------ processing

    def _drain(self) -> None:
        """Record every request finished so far (under the lock, so a return means they are recorded)."""
        with self._lock:
            while self._finished:
                req, meta, finished_at, grammar_wait, parent, text = self._finished.popleft()
                rec = RequestRecord.from_meta(meta, params=req.params, input_ids=req.input_ids, stream=req.stream,
                                              grammar_wait=grammar_wait, finished_at=finished_at, output_text=text)
                self._record(rec, parent)

    def _record(self, rec: RequestRecord, parent: Any) -> None:
        try:
            self.metrics.observe_request(rec)
            self.request_log.log(rec)
            tracer = tracing.active_tracer() if parent is not None else None  # None: tracing was off at arrival
            if tracer is not None:
                tracing.emit_request_spans(tracer, rec, parent)
        except Exception:  # observability must never take requests down with it
            logger.exception("recording request %s failed", rec.rid)

    def refresh(self) -> dict | None:
        """Record finished requests and publish fresh engine gauges; returns the stats (None when the
        engine no longer answers)."""
        self._drain()
        try:
            stats = self.get_stats()
        except (RuntimeError, TimeoutError):  # the engine stopped: keep the last values
            return None
        with self._lock:
            self.metrics.publish(stats, self.context_length, self.config.page_size)
        return stats

    def _run(self) -> None:
        interval = self.config.stats_log_interval
        next_tick = time.monotonic() + interval if interval > 0 else float("inf")
        while not self._stop:
            self._wake.wait(min(max(next_tick - time.monotonic(), 0.0), 3600.0))
            self._wake.clear()
            self._drain()
            if time.monotonic() >= next_tick and not self._stop:
                stats = self.refresh()
                if stats is not None:
                    self.batch_log.log(stats)
                next_tick = time.monotonic() + interval

    def shutdown(self) -> None:
        """Stop the thread; requests finishing later (aborted by the engine's shutdown) are recorded
        on the thread that finishes them. Flushes spans to the exporter installed here, if any."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)
        self._closed = True
        self._drain()
        if self._tracer_provider is not None:
            self._tracer_provider.force_flush()
