"""Scheduler metrics: counters and latency histograms, read by the server's /metrics."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Histogram:
    """Cumulative-bucket histogram in Prometheus' layout."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, x: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, x)] += 1
        self.total += x
        self.n += 1


@dataclass
class SchedulerMetrics:
    started: float = field(default_factory=time.perf_counter)
    requests_arrived: int = 0
    requests_finished: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    retractions: int = 0
    forward_steps: int = 0
    jump_forward_tokens: int = 0
    spec_verify_ct: int = 0  # forward steps that gave tokens to requests that may draft
    spec_completion_tokens: int = 0  # output tokens of those steps (accepted drafts, sampled, jump-forward)
    spec_num_proposed_drafts: int = 0
    spec_num_correct_drafts: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)

    def on_arrival(self) -> None:
        self.requests_arrived += 1

    def on_finish(self) -> None:
        self.requests_finished += 1

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_token_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def snapshot(self, **gauges: float) -> dict:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        seen = self.prompt_tokens + self.cached_prompt_tokens
        return dict(
            gauges,
            requests_arrived=self.requests_arrived,
            requests_finished=self.requests_finished,
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
            ttft=self.ttft,
            itl=self.itl,
        )
