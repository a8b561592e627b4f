"""RouterConfig: the router's settings in one frozen dataclass; its CLI flags are generated from the fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RouterConfig:
    """How the router picks a replica and watches them. Defaults follow SGLang's router where it has one."""

    policy: Literal["cache_aware", "round_robin"] = "cache_aware"
    """cache_aware: the replica whose prompts share the longest prefix with the request, unless the load
    is imbalanced (then the least loaded); round_robin: each replica in turn."""
    cache_threshold: float = 0.5
    """Cache-aware: the shortest matched share of the prompt (0..1) that routes by prefix; below it the
    request goes to the replica with the smallest prefix tree (the most free cache)."""
    balance_abs_threshold: int = 32
    """Cache-aware: load is imbalanced when the busiest replica has this many more requests than the least
    busy one ..."""
    balance_rel_threshold: float = 1.5
    """... and more than this many times as many; then requests go to the least loaded replica."""
    max_tree_size: int = 1 << 22
    """Most prompt characters (or token ids) remembered per replica; the least recently used branches
    are evicted beyond it."""
    worker_max_inflight: int = 256
    """Most requests sent to one replica at once; more wait in the router (and are sent to another
    replica if theirs fails before they start)."""
    health_check_interval: float = 5.0
    """Seconds between health checks of each replica."""
    health_check_timeout: float = 5.0
    """Seconds a health check waits for a replica's answer."""
    health_failure_threshold: int = 2
    """Failed health checks in a row that take a replica out of rotation (a refused connection takes
    it out at once); one passing check brings it back."""

    def __post_init__(self) -> None:
        checks = [
            ("policy", self.policy in ("cache_aware", "round_robin"), "cache_aware or round_robin"),
            ("cache_threshold", 0.0 <= self.cache_threshold <= 1.0, "in [0, 1]"),
            ("balance_abs_threshold", self.balance_abs_threshold >= 0, ">= 0"),
            ("balance_rel_threshold", self.balance_rel_threshold >= 1.0, ">= 1"),
            ("max_tree_size", self.max_tree_size >= 1, ">= 1"),
            ("worker_max_inflight", self.worker_max_inflight >= 1, ">= 1"),
            ("health_check_interval", self.health_check_interval > 0, "> 0"),
            ("health_check_timeout", self.health_check_timeout > 0, "> 0"),
            ("health_failure_threshold", self.health_failure_threshold >= 1, ">= 1"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"RouterConfig.{name}={getattr(self, name)!r} is invalid: must be {allowed}")
