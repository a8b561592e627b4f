"""GET /metrics and GET /stats bodies: the Prometheus text exposition and the engine stats as JSON.

In one process the engine's own registry is rendered, with the process collectors (CPU, memory, open
files, GC) beside it. When `PROMETHEUS_MULTIPROC_DIR` is set before prometheus_client is imported,
every process (an engine replica each) writes its values to files in that directory and /metrics
renders all of them through prometheus_client's `MultiProcessCollector`: counters and histograms
add up, gauges keep each replica's most recent value (labelled `dp_rank`). The directory must be
empty when the processes start (the launcher clears it), as prometheus_client requires.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    multiprocess,
)
from prometheus_client import CollectorRegistry as Registry


def multiprocess_dir() -> str | None:
    """The directory prometheus_client's multiprocess mode writes to, or None in one-process mode."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir") or None


def add_process_collectors(registry: Registry) -> None:
    """Process, platform and GC series (`process_*`, `python_*`) in `registry` (one-process mode only)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


def render(registry: Registry | None) -> tuple[bytes, str]:
    """(body, content type) of the Prometheus text format: this process's engine metrics `registry`,
    or in multiprocess mode every process's files (`registry` may then be None: a front process with
    no engine of its own renders its replicas')."""
    if multiprocess_dir() is None:
        if registry is None:
            raise ValueError("render(None) needs prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR)")
        return generate_latest(registry), CONTENT_TYPE_LATEST
    registry = Registry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def stats_json(stats: dict[str, Any]) -> dict[str, Any]:
    """`Engine.get_stats()` as JSON: histograms as {"buckets", "counts" (per bucket, +Inf last), "sum", "count"}."""
    out: dict[str, Any] = {}
    for key, value in stats.items():
        if hasattr(value, "buckets") and hasattr(value, "counts"):
            out[key] = {"buckets": list(value.buckets), "counts": list(value.counts), "sum": value.total,
                        "count": value.n}
        elif isinstance(value, (int, float, str, bool)) or value is None:
            out[key] = value
    return out
