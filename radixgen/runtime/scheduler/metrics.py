"""Scheduler metrics: plain counters and bucketed latency histograms kept on the scheduler thread.

The scheduler thread only adds to ints and bucket counts (no locks, no Prometheus calls on its hot
path). `snapshot()` runs on that thread (through `Scheduler.stats`, i.e. `Engine.get_stats()`) and
returns copies, so a reader on another thread sees one consistent moment. The observability layer
(`runtime/observability/`) turns successive snapshots into Prometheus series, rates and the
periodic batch log line. The latency buckets are SGLang's, so the exported histograms match its.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

# SGLang's default buckets (sglang/srt/observability/metrics_collector.py), in seconds
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)


@dataclass
class Histogram:
    """Per-bucket counts in Prometheus' layout: `counts[i]` holds values <= `buckets[i]` (and above
    the previous bound); the last count is the +Inf bucket. Not cumulative."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, x: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, x)] += 1
        self.total += x
        self.n += 1

    def copy(self) -> Histogram:
        return Histogram(self.buckets, list(self.counts), self.total, self.n)

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since `earlier` (a copy of this histogram taken before)."""
        counts = [a - b for a, b in zip(self.counts, earlier.counts, strict=True)]
        return Histogram(self.buckets, counts, self.total - earlier.total, self.n - earlier.n)


@dataclass
class SchedulerMetrics:
    """Cumulative counts since the scheduler started (written by the scheduler thread only)."""

    started: float = field(default_factory=time.perf_counter)
    requests_arrived: int = 0
    requests_finished: int = 0
    requests_admitted: int = 0
    prompt_tokens: int = 0  # prompt tokens computed (not served from the cache), retraction re-computes included
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    retractions: int = 0
    forward_steps: int = 0
    jump_forward_tokens: int = 0
    spec_verify_ct: int = 0  # forward steps that gave tokens to requests that may draft
    spec_completion_tokens: int = 0  # output tokens of those steps (accepted drafts, sampled, jump-forward)
    spec_num_proposed_drafts: int = 0
    spec_num_correct_drafts: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))

    def on_arrival(self) -> None:
        self.requests_arrived += 1

    def on_admit(self, cached_tokens: int) -> None:
        """A request entered the running batch for the first time with `cached_tokens` from the tree."""
        self.requests_admitted += 1
        self.cached_prompt_tokens += cached_tokens

    def on_finish(self) -> None:
        self.requests_finished += 1

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_token_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def snapshot(self, **gauges: float) -> dict:
        """Every counter, since-start rates and copies of the histograms, plus the caller's `gauges`."""
        now = time.perf_counter()
        elapsed = max(now - self.started, 1e-9)
        seen = self.prompt_tokens + self.cached_prompt_tokens
        return dict(
            gauges,
            time=now,
            uptime=elapsed,
            requests_arrived=self.requests_arrived,
            requests_finished=self.requests_finished,
            requests_admitted=self.requests_admitted,
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            generated_tokens=self.generated_tokens,
            retractions=self.retractions,
            forward_steps=self.forward_steps,
            jump_forward_tokens=self.jump_forward_tokens,
            spec_verify_ct=self.spec_verify_ct,
            spec_num_proposed_drafts=self.spec_num_proposed_drafts,
            spec_num_correct_drafts=self.spec_num_correct_drafts,
            spec_accept_rate=(self.spec_num_correct_drafts / self.spec_num_proposed_drafts
                              if self.spec_num_proposed_drafts else 0.0),
            spec_accept_length=self.spec_completion_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0,
            cache_hit_rate=self.cached_prompt_tokens / seen if seen else 0.0,
            prompt_throughput=self.prompt_tokens / elapsed,
            generation_throughput=self.generated_tokens / elapsed,
            ttft=self.ttft.copy(),
            itl=self.itl.copy(),
        )


def at_start(snapshot: dict) -> dict:
    """What a snapshot of the same scheduler read when it started: every count 0, histograms empty
    (the baseline for the first interval of rates computed between snapshots)."""
    start = {k: (0 if isinstance(v, (int, float)) else v) for k, v in snapshot.items()}
    start.update(time=snapshot["time"] - snapshot["uptime"], uptime=0.0, ttft=Histogram(snapshot["ttft"].buckets),
                 itl=Histogram(snapshot["itl"].buckets))
    return start
