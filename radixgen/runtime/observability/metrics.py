"""EngineMetrics: the Prometheus series of one engine, with SGLang's names, labels and buckets.

Names, label sets, buckets and meanings follow SGLang's collector
(`sglang/srt/observability/metrics_collector.py`, 0.5.x) for everything radixgen also measures, so
dashboards and alerts written for SGLang work unchanged:

- per request (its final `meta_info`; labels `model_name`, `engine_type`, plus `is_streaming` where
  SGLang has it): `sglang:num_requests_total`, `sglang:prompt_tokens_total`,
  `sglang:generation_tokens_total`, `sglang:cached_tokens_total`, `sglang:num_so_requests_total`,
  `sglang:num_aborted_requests_total`, the histograms `sglang:time_to_first_token_seconds`,
  `sglang:e2e_request_latency_seconds`, `sglang:request_time_per_output_token_seconds`,
  `sglang:prompt_tokens_histogram`, `sglang:uncached_prompt_tokens_histogram`,
  `sglang:generation_tokens_histogram`, and (scheduler labels) `sglang:queue_time_seconds`;
- per token: `sglang:inter_token_latency_seconds`, added in bulk from the scheduler's bucket counts;
- from `Engine.get_stats()` at each refresh (labels `model_name`, `engine_type`, `tp_rank`,
  `pp_rank`, `moe_ep_rank`, and `dp_rank` for a data-parallel replica): the gauges
  `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`,
  `sglang:num_used_tokens`, `sglang:kv_used_tokens`, `sglang:kv_available_tokens`,
  `sglang:kv_evictable_tokens`, `sglang:gen_throughput` and `sglang:cache_hit_rate` (both over the
  time since the previous refresh, as SGLang's are over its log interval), the constants
  `sglang:max_total_num_tokens`, `sglang:context_len`, `sglang:page_size`, and the counters
  `sglang:num_retracted_requests_total`, `sglang:realtime_tokens_total{mode}`;
- grammar: `sglang:grammar_compilation_time_seconds`, `sglang:num_grammar_total`,
  `sglang:num_grammar_cache_hit_total`.

radixgen's own, under `radixgen:`: `jump_forward_tokens_total`, `forward_steps_total`,
`worker_busy_seconds_total` and `finished_requests_total{finish_reason, constraint}`.

Token usage is SGLang's: KV slots held by requests (not the evictable radix cache) over capacity,
so it returns to 0 when the engine is idle. Gauges use `multiprocess_mode="mostrecent"`, counters
and histograms add up across processes (prometheus_client's multiprocess mode, exposition.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from radixgen.runtime.observability.exposition import add_process_collectors, multiprocess_dir
from radixgen.runtime.observability.records import RequestRecord
from radixgen.runtime.scheduler.metrics import ITL_BUCKETS, TTFT_BUCKETS, at_start
from radixgen.runtime.scheduler.metrics import Histogram as BucketCounts

E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
QUEUE_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90,
                 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000,
                 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000,
                 400000, 600000, 800000, 1000000, 1100000)
GRAMMAR_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 90, 120, 240)


def _bool(x: bool) -> str:
    return "true" if x else "false"


class EngineMetrics:
    """prometheus_client metrics of one engine in their own registry (see the module docstring).

    `model_name` labels every series; `dp_rank` (a data-parallel replica's index) labels the
    scheduler series so that replicas in separate processes keep separate gauges.
    """

    def __init__(self, model_name: str, dp_rank: int | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        if multiprocess_dir() is None:
            add_process_collectors(self.registry)
        self.request_labels = {"model_name": model_name, "engine_type": "unified"}
        self.scheduler_labels: dict[str, str] = {**self.request_labels, "tp_rank": "0", "pp_rank": "0",
                                                 "moe_ep_rank": "0"}
        if dp_rank is not None:
            self.scheduler_labels["dp_rank"] = str(dp_rank)
        req, sched = list(self.request_labels), list(self.scheduler_labels)
        stream = [*req, "is_streaming"]

        def counter(name: str, doc: str, labels: Sequence[str]) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, sched, registry=self.registry, multiprocess_mode="mostrecent")

        def histogram(name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, labels, registry=self.registry, buckets=buckets)

        # ---- per request (SGLang's tokenizer-manager series)
        self.num_requests = counter("sglang:num_requests_total", "Number of requests processed.", stream)
        self.prompt_tokens = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", stream)
        self.generation_tokens = counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                         stream)
        self.cached_tokens = counter("sglang:cached_tokens_total", "Number of cached prompt tokens by source.",
                                     [*req, "cache_source"])
        self.num_so_requests = counter("sglang:num_so_requests_total",
                                       "Number of structured output requests processed.", req)
        self.num_aborted = counter("sglang:num_aborted_requests_total", "Number of requests aborted.", req)
        self.ttft = histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              stream, TTFT_BUCKETS)
        self.e2e = histogram("sglang:e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in seconds", stream, E2E_BUCKETS)
        self.tpot = histogram("sglang:request_time_per_output_token_seconds",
                              "Per-request TPOT in seconds: (finished_time - first_token_time) / "
                              "(completion_tokens - 1).", stream, ITL_BUCKETS)
        self.itl = histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             req, ITL_BUCKETS)
        self.prompt_hist = histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", req,
                                     TOKEN_BUCKETS)
        self.uncached_hist = histogram("sglang:uncached_prompt_tokens_histogram",
                                       "Histogram of uncached (compute) prompt token length.", req, TOKEN_BUCKETS)
        self.generation_hist = histogram("sglang:generation_tokens_histogram", "Histogram of generation token length.",
                                         req, TOKEN_BUCKETS)
        self.queue_time = histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", sched,
                                    QUEUE_BUCKETS)
        # ---- scheduler state (refreshed from Engine.get_stats())
        self.num_running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.kv_used = gauge("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.")
        self.kv_available = gauge("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.")
        self.kv_evictable = gauge("sglang:kv_evictable_tokens",
                                  "Number of evictable (radix-cached) token slots in the KV cache pool.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.max_total_tokens = gauge("sglang:max_total_num_tokens",
                                      "Maximum total number of tokens in the KV cache pool.")
        self.context_len = gauge("sglang:context_len", "Maximum context length.")
        self.page_size = gauge("sglang:page_size", "KV cache page size in tokens.")
        self.retracted = counter("sglang:num_retracted_requests_total", "Total number of retracted requests.", sched)
        self.realtime_tokens = counter("sglang:realtime_tokens_total",
                                       "Total number of tokens processed. mode: prefill_compute, prefill_cache, "
                                       "decode.", [*sched, "mode"])
        # ---- speculative decoding (SGLang's gauge names; the counts are radixgen's)
        self.spec_accept_length = gauge("sglang:spec_accept_length",
                                        "The average acceptance length of speculative decoding.")
        self.spec_accept_rate = gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding.")
        self.spec_verify = counter("radixgen:spec_verify_steps_total",
                                   "Forward steps that gave tokens to requests that may draft.", sched)
        self.spec_proposed = counter("radixgen:spec_proposed_drafts_total", "Draft tokens proposed.", sched)
        self.spec_correct = counter("radixgen:spec_correct_drafts_total", "Draft tokens accepted.", sched)
        # ---- grammar
        self.grammar_time = histogram("sglang:grammar_compilation_time_seconds",
                                      "Histogram of grammar compilation time in seconds.", sched, GRAMMAR_BUCKETS)
        self.grammar_total = counter("sglang:num_grammar_total", "Number of the total grammar requests.", sched)
        self.grammar_hits = counter("sglang:num_grammar_cache_hit_total", "Number of grammar cache hits.", sched)
        # ---- radixgen's own
        self.jump_forward = counter("radixgen:jump_forward_tokens_total",
                                    "Tokens appended by jump-forward (forced by a grammar, not sampled).", sched)
        self.forward_steps = counter("radixgen:forward_steps_total", "Model forward passes (scheduler steps).", sched)
        self.worker_busy = counter("radixgen:worker_busy_seconds_total",
                                   "Seconds the model worker spent running batches.", sched)
        self.finished = counter("radixgen:finished_requests_total", "Finished requests by finish reason and "
                                "constraint kind (none, json_schema, regex, ebnf, structural_tag).",
                                [*req, "finish_reason", "constraint"])
        self._last: dict[str, Any] | None = None  # the previous stats snapshot published
        self._declare_series()

    def _declare_series(self) -> None:
        """Create every series whose labels are known up front, at 0, so that /metrics lists each name
        before the first request (dashboards and alerts see 0, not "no data")."""
        req, sched = self.request_labels, self.scheduler_labels
        for metric in (self.num_requests, self.prompt_tokens, self.generation_tokens, self.ttft, self.e2e, self.tpot):
            for streaming in ("false", "true"):
                metric.labels(**req, is_streaming=streaming)
        self.cached_tokens.labels(**req, cache_source="device")
        for metric in (self.num_so_requests, self.num_aborted, self.itl, self.prompt_hist, self.uncached_hist,
                       self.generation_hist):
            metric.labels(**req)
        for metric in (self.queue_time, self.retracted, self.grammar_time, self.grammar_total, self.grammar_hits,
                       self.jump_forward, self.forward_steps, self.worker_busy, self.spec_verify, self.spec_proposed,
                       self.spec_correct):
            metric.labels(**sched)
        for mode in ("prefill_compute", "prefill_cache", "decode"):
            self.realtime_tokens.labels(**sched, mode=mode)

    # ------------------------------------------------------------------ per request

    def observe_request(self, rec: RequestRecord) -> None:
        """Count one finished request (called once per request, off the scheduler thread)."""
        labels = self.request_labels
        stream = {**labels, "is_streaming": _bool(rec.stream)}
        self.num_requests.labels(**stream).inc()
        self.prompt_tokens.labels(**stream).inc(rec.prompt_tokens)
        self.generation_tokens.labels(**stream).inc(rec.completion_tokens)
        if rec.cached_tokens:
            self.cached_tokens.labels(**labels, cache_source="device").inc(rec.cached_tokens)
        if rec.constraint is not None:
            self.num_so_requests.labels(**labels).inc()
        if rec.finish_reason == "abort":
            self.num_aborted.labels(**labels).inc()
        self.finished.labels(**labels, finish_reason=rec.finish_reason, constraint=rec.constraint or "none").inc()
        self.e2e.labels(**stream).observe(rec.e2e)
        if rec.ttft is not None:
            self.ttft.labels(**stream).observe(rec.ttft)
        tpot = rec.time_per_output_token
        if tpot is not None:
            self.tpot.labels(**stream).observe(tpot)
        if rec.queue_time is not None:
            self.queue_time.labels(**self.scheduler_labels).observe(rec.queue_time)
        self.prompt_hist.labels(**labels).observe(rec.prompt_tokens)
        self.uncached_hist.labels(**labels).observe(rec.prompt_tokens - rec.cached_tokens)
        self.generation_hist.labels(**labels).observe(rec.completion_tokens)

    def observe_grammar_request(self, cache_hit: bool) -> None:
        """A constrained request arrived; `cache_hit`: its compiled grammar was ready (no compile to wait for)."""
        self.grammar_total.labels(**self.scheduler_labels).inc()
        if cache_hit:
            self.grammar_hits.labels(**self.scheduler_labels).inc()

    def observe_grammar_compile(self, seconds: float) -> None:
        self.grammar_time.labels(**self.scheduler_labels).observe(seconds)

    # ------------------------------------------------------------------ engine state

    def start_from(self, stats: dict[str, Any]) -> None:
        """Count from the `get_stats()` snapshot `stats` on, instead of from the engine's start."""
        self._last = stats

    def publish(self, stats: dict[str, Any], context_len: int, page_size: int) -> None:
        """Set the gauges from a `get_stats()` snapshot and add what the counters gained since the
        previous one."""
        s = self.scheduler_labels
        cap = stats["kv_capacity"]
        in_use = stats["kv_used"] - stats["kv_evictable"]  # held by requests; the radix cache can be evicted
        self.num_running.labels(**s).set(stats["running"])
        self.num_queue.labels(**s).set(stats["waiting"])
        self.token_usage.labels(**s).set(in_use / cap)
        self.num_used_tokens.labels(**s).set(in_use)
        self.kv_used.labels(**s).set(in_use)
        self.kv_available.labels(**s).set(cap - stats["kv_used"])
        self.kv_evictable.labels(**s).set(stats["kv_evictable"])
        self.max_total_tokens.labels(**s).set(cap)
        self.context_len.labels(**s).set(context_len)
        self.page_size.labels(**s).set(page_size)
        last = self._last or at_start(stats)
        delta = {k: stats[k] - last[k] for k in COUNTED}
        self.retracted.labels(**s).inc(delta["retractions"])
        self.jump_forward.labels(**s).inc(delta["jump_forward_tokens"])
        self.forward_steps.labels(**s).inc(delta["forward_steps"])
        self.worker_busy.labels(**s).inc(delta["worker_busy_seconds"])
        self.spec_verify.labels(**s).inc(delta["spec_verify_ct"])
        self.spec_proposed.labels(**s).inc(delta["spec_num_proposed_drafts"])
        self.spec_correct.labels(**s).inc(delta["spec_num_correct_drafts"])
        self.spec_accept_length.labels(**s).set(stats["spec_accept_length"])
        self.spec_accept_rate.labels(**s).set(stats["spec_accept_rate"])
        for mode, key in (("prefill_compute", "prompt_tokens"), ("prefill_cache", "cached_prompt_tokens"),
                          ("decode", "generated_tokens")):
            self.realtime_tokens.labels(**s, mode=mode).inc(delta[key])
        add_bucket_counts(self.itl.labels(**self.request_labels), stats["itl"].minus(last["itl"]))
        elapsed = stats["time"] - last["time"]
        self.gen_throughput.labels(**s).set(delta["generated_tokens"] / elapsed if elapsed > 0 else 0.0)
        seen = delta["prompt_tokens"] + delta["cached_prompt_tokens"]
        if seen or self._last is None:  # like SGLang's, the rate of the latest prefills; kept while none run
            self.cache_hit_rate.labels(**s).set(delta["cached_prompt_tokens"] / seen if seen else 0.0)
        self._last = stats


COUNTED = ("retractions", "jump_forward_tokens", "forward_steps", "worker_busy_seconds", "prompt_tokens",
           "cached_prompt_tokens", "generated_tokens", "spec_verify_ct", "spec_num_proposed_drafts",
           "spec_num_correct_drafts")  # cumulative stats exported as counters


def add_bucket_counts(child: Any, counts: BucketCounts) -> None:
    """Add many observations to a prometheus_client histogram child at once, from per-bucket counts
    with the same bounds. prometheus_client has no public bulk observe; this uses the child's
    `_buckets` and `_sum` values as SGLang's collector does. tests/observability checks the result
    against `observe()` called value by value, so a change in prometheus_client shows up there."""
    for value, n in zip(child._buckets, counts.counts, strict=True):
        if n:
            value.inc(n)
    if counts.n:
        child._sum.inc(counts.total)
