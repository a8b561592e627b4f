"""The router's Prometheus metrics, as a collector of metric families read from the pool when scraped.

`RouterCollector(pool)` can be registered in any prometheus_client registry (the router serves its
own, `registry(pool)`, on GET /metrics), so it composes with the engine's metrics in one process.
Families (prefix `radixgen_router_`): per replica its load (in flight, queued in the router), whether
it is in rotation and its prefix-tree size; routing decisions by replica and reason; the share of
decisions made by prefix match; failed requests by code; queued requests routed again.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from radixgen.runtime.router.policy import PREFIX
from radixgen.runtime.router.workers import WorkerPool


class RouterCollector:
    """prometheus_client collector over a WorkerPool's live state."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        p = "radixgen_router_"
        in_flight = GaugeMetricFamily(p + "worker_in_flight", "Requests sent to the replica and not finished.",
                                      labels=["worker"])
        queued = GaugeMetricFamily(p + "worker_queued", "Requests waiting in the router for the replica.",
                                   labels=["worker"])
        healthy = GaugeMetricFamily(p + "worker_healthy", "1 while the replica is in rotation.", labels=["worker"])
        tree = GaugeMetricFamily(p + "worker_tree_size", "Prompt characters (or ids) in the replica's prefix tree.",
                                 labels=["worker"])
        routed = CounterMetricFamily(p + "requests_routed", "Routing decisions by replica and reason (prefix, "
                                     "load_balance, cache_capacity, round_robin).", labels=["worker", "reason"])
        trees = getattr(self.pool.policy, "trees", {})
        total = by_prefix = 0
        for w in self.pool.workers:
            in_flight.add_metric([w.url], w.in_flight)
            queued.add_metric([w.url], len(w.queue))
            healthy.add_metric([w.url], 1 if w.healthy else 0)
            tree.add_metric([w.url], trees[w.url].size if w.url in trees else 0)
            for reason, n in sorted(w.routed.items()):
                routed.add_metric([w.url, reason], n)
                total += n
                by_prefix += n if reason == PREFIX else 0
        yield from (in_flight, queued, healthy, tree, routed)
        yield GaugeMetricFamily(p + "prefix_routed_ratio", "Share of routing decisions made by prefix match.",
                                value=by_prefix / total if total else 0.0)
        errors = CounterMetricFamily(p + "request_errors", "Requests the router answered with an error, by code.",
                                     labels=["code"])
        for code, n in sorted(self.pool.errors.items()):
            errors.add_metric([code], n)
        yield errors
        yield CounterMetricFamily(p + "rerouted_requests", "Queued requests routed again after their replica left.",
                                  value=self.pool.rerouted)


def registry(pool: WorkerPool) -> CollectorRegistry:
    """A registry holding only the router's metrics."""
    reg = CollectorRegistry(auto_describe=True)
    reg.register(RouterCollector(pool))
    return reg
