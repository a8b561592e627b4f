"""Routing policies: which healthy replica gets a request.

Cache-aware (the policy of SGLang's router): the router keeps one approximate prefix tree per replica
of the prompts it sent there. If the load is imbalanced, i.e. the busiest replica has more than
`balance_abs_threshold` requests more than the least busy AND more than `balance_rel_threshold` times
as many, the request goes to the least loaded replica. Otherwise it goes to the replica whose tree
matches the longest prefix of the prompt when that match covers more than `cache_threshold` of the
prompt, else to the replica with the smallest tree (the most cache room). The prompt is then added to
the chosen replica's tree. Round robin takes the replicas in turn.

Load is what the router knows: requests sent to a replica and not finished, plus those waiting in the
router for it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

from radixgen.runtime.router.config import RouterConfig
from radixgen.runtime.router.prefix_tree import Key, PrefixTree

PREFIX, BALANCE, CAPACITY, ROUND_ROBIN = "prefix", "load_balance", "cache_capacity", "round_robin"


class Routable(Protocol):
    url: str

    @property
    def load(self) -> int: ...


@dataclass(frozen=True)
class Decision:
    worker: Routable
    reason: str  # PREFIX | BALANCE | CAPACITY | ROUND_ROBIN
    matched: float = 0.0  # share of the prompt matched on the chosen replica's tree


class CacheAwarePolicy:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.trees: dict[str, PrefixTree] = {}

    def tree(self, url: str) -> PrefixTree:
        if url not in self.trees:
            self.trees[url] = PrefixTree(self.config.max_tree_size)
        return self.trees[url]

    def choose(self, key: Key, workers: list[Routable]) -> Decision:
        """Pick one of `workers` (non-empty, healthy) for a prompt `key` and remember it there."""
        c = self.config
        loads = [w.load for w in workers]
        lo, hi = min(loads), max(loads)
        if hi - lo > c.balance_abs_threshold and hi > lo * c.balance_rel_threshold:
            worker = workers[loads.index(lo)]
            decision = Decision(worker, BALANCE, self.tree(worker.url).match(key) / max(len(key), 1))
        else:
            matches = [self.tree(w.url).match(key) for w in workers]
            best = max(range(len(workers)), key=lambda i: (matches[i], -loads[i]))
            rate = matches[best] / max(len(key), 1)
            if key and rate > c.cache_threshold:
                decision = Decision(workers[best], PREFIX, rate)
            else:
                roomiest = min(range(len(workers)), key=lambda i: (self.tree(workers[i].url).size, loads[i]))
                decision = Decision(workers[roomiest], CAPACITY, matches[roomiest] / max(len(key), 1))
        if key:
            self.tree(decision.worker.url).insert(key)
        return decision

    def forget(self, url: str) -> None:
        """A replica restarted or left: what it had cached is gone."""
        self.trees.pop(url, None)

    def clear(self) -> None:
        self.trees.clear()


class RoundRobinPolicy:
    def __init__(self, config: RouterConfig) -> None:
        self._turn = itertools.count()
        self.trees: dict[str, PrefixTree] = {}

    def choose(self, key: Key, workers: list[Routable]) -> Decision:
        return Decision(workers[next(self._turn) % len(workers)], ROUND_ROBIN)

    def forget(self, url: str) -> None:
        pass

    def clear(self) -> None:
        pass


def make_policy(config: RouterConfig) -> CacheAwarePolicy | RoundRobinPolicy:
    return CacheAwarePolicy(config) if config.policy == "cache_aware" else RoundRobinPolicy(config)
