"""Engine stats -> Prometheus text exposition format (version 0.0.4) for GET /metrics, and -> JSON.

Every series is prefixed `radixgen_` and labelled with `model_name`. Gauges: running / waiting
requests, KV tokens used / capacity / evictable and the usage ratio, cache hit rate, prompt and
generation throughput (tokens/s since start). Counters: requests, prompt / cached / generated tokens,
retractions. Histograms: time to first token and inter-token latency in seconds (the engine keeps
per-bucket counts; Prometheus buckets are cumulative, so they are summed here). Numeric stats not
listed below are exported as gauges under their own name, so a new engine stat shows up unasked.
"""

from __future__ import annotations

import math
from typing import Any

GAUGES = {
    "running": ("num_running_reqs", "Requests running (decoding or prefilling) now."),
    "waiting": ("num_waiting_reqs", "Requests waiting to be scheduled."),
    "kv_used": ("kv_used_tokens", "KV cache slots in use (running requests and the radix cache)."),
    "kv_capacity": ("kv_capacity_tokens", "KV cache capacity in tokens."),
    "kv_evictable": ("kv_evictable_tokens", "KV slots held only by the radix cache (evictable)."),
    "cache_hit_rate": ("cache_hit_rate", "Fraction of prompt tokens served from the radix cache."),
    "prompt_throughput": ("prompt_throughput_tokens_per_second", "Prompt tokens computed per second since start."),
    "generation_throughput": ("generation_throughput_tokens_per_second",
                              "Tokens generated per second since start."),
}
COUNTERS = {
    "requests_arrived": ("requests_arrived_total", "Requests received."),
    "requests_finished": ("requests_finished_total", "Requests finished (any reason)."),
    "prompt_tokens": ("prompt_tokens_total", "Prompt tokens computed (not served from the cache)."),
    "cached_prompt_tokens": ("cached_prompt_tokens_total", "Prompt tokens served from the radix cache."),
    "generated_tokens": ("generation_tokens_total", "Tokens generated."),
    "retractions": ("retractions_total", "Decode requests retracted when the KV cache ran out."),
}
HISTOGRAMS = {
    "ttft": ("time_to_first_token_seconds", "Time from arrival to the first output token."),
    "itl": ("inter_token_latency_seconds", "Time between consecutive output tokens of a request."),
}


def _num(x: float) -> str:
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, int):
        return str(x)
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return "NaN" if math.isnan(x) else repr(float(x))


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(stats: dict[str, Any], model_name: str) -> str:
    label = f'model_name="{_esc(model_name)}"'
    lines: list[str] = []

    def series(name: str, kind: str, help_: str, value: float) -> None:
        lines.extend([f"# HELP radixgen_{name} {help_}", f"# TYPE radixgen_{name} {kind}",
                      f"radixgen_{name}{{{label}}} {_num(value)}"])

    for key, (name, help_) in GAUGES.items():
        if key in stats:
            series(name, "gauge", help_, stats[key])
    if stats.get("kv_capacity"):
        series("kv_usage_ratio", "gauge", "kv_used / kv_capacity.", stats.get("kv_used", 0) / stats["kv_capacity"])
    for key, (name, help_) in COUNTERS.items():
        if key in stats:
            series(name, "counter", help_, stats[key])
    for key, (name, help_) in HISTOGRAMS.items():
        h = stats.get(key)
        if h is None:
            continue
        lines += [f"# HELP radixgen_{name} {help_}", f"# TYPE radixgen_{name} histogram"]
        total = 0
        for le, c in zip([*h.buckets, math.inf], h.counts, strict=False):
            total += c
            lines.append(f'radixgen_{name}_bucket{{{label},le="{_num(float(le))}"}} {total}')
        lines.append(f"radixgen_{name}_sum{{{label}}} {_num(float(h.total))}")
        lines.append(f"radixgen_{name}_count{{{label}}} {h.n}")
    known = set(GAUGES) | set(COUNTERS) | set(HISTOGRAMS)
    for key, value in stats.items():
        if key not in known and isinstance(value, (int, float)) and key.isidentifier():
            series(key, "gauge", f"Engine stat {key}.", value)
    return "\n".join(lines) + "\n"


def to_json(stats: dict[str, Any]) -> dict[str, Any]:
    """Stats with histograms as plain dicts (per-bucket counts, last bucket +Inf)."""
    out: dict[str, Any] = {}
    for key, value in stats.items():
        if hasattr(value, "buckets") and hasattr(value, "counts"):
            out[key] = {"buckets": list(value.buckets), "counts": list(value.counts), "sum": value.total,
                        "count": value.n}
        elif isinstance(value, (int, float, str, bool)) or value is None:
            out[key] = value
    return out
