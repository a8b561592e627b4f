"""The router's prefix trees and cache-aware policy, without servers: the tree's matches against a naive
oracle (longest common prefix with any inserted prompt), its size bound under eviction, and the
policy's choices (prefix affinity, least loaded when imbalanced, the roomiest tree below the threshold)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.runtime.router.config import RouterConfig
from radixgen.runtime.router.policy import BALANCE, CAPACITY, PREFIX, CacheAwarePolicy
from radixgen.runtime.router.prefix_tree import PrefixTree


def naive_match(stored: list, key) -> int:
    best = 0
    for s in stored:
        n = 0
        while n < min(len(s), len(key)) and s[n] == key[n]:
            n += 1
        best = max(best, n)
    return best


def stored_size(tree: PrefixTree) -> tuple[int, int]:
    """(elements, nodes) counted by walking the tree."""
    size, nodes, stack = 0, 1, list(tree.root.children.values())
    while stack:
        node = stack.pop()
        size, nodes = size + len(node.edge), nodes + 1
        stack.extend(node.children.values())
    return size, nodes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abc", max_size=12), max_size=25), st.lists(st.text(alphabet="abc", max_size=12),
                                                                                max_size=10))
def test_tree_matches_the_naive_oracle(inserted, queries):
    tree = PrefixTree(max_size=10**6)
    for i, s in enumerate(inserted):
        tree.insert(s)
        for q in queries + inserted[: i + 1]:
            assert tree.match(q) == naive_match(inserted[: i + 1], q)
    assert (tree.size, tree.nodes) == stored_size(tree)


def test_token_id_keys_match_too():
    tree = PrefixTree(max_size=1000)
    tree.insert((1, 2, 3, 4))
    tree.insert((1, 2, 9))
    assert tree.match((1, 2, 3, 7)) == 3 and tree.match((1, 2, 9, 9)) == 3 and tree.match((5,)) == 0
    assert tree.match("12") == 0  # text never matches ids


def test_eviction_keeps_the_tree_bounded_and_the_recent_prompts():
    rng = random.Random(0)
    tree = PrefixTree(max_size=5000)
    system = ["".join(rng.choice("abcdefgh") for _ in range(300)) for _ in range(4)]
    recent = []
    for i in range(3000):
        key = system[i % 4] + "".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 120)))
        tree.insert(key)
        recent = (recent + [key])[-5:]
        assert tree.size <= 5000
    size, nodes = stored_size(tree)
    assert (size, nodes) == (tree.size, tree.nodes) and nodes < 5000
    assert all(tree.match(k) == len(k) for k in recent)  # least recently used goes first
    assert all(tree.match(s) == 300 for s in system)  # shared prefixes are on every recent path


@dataclass(eq=False)
class FakeWorker:
    url: str
    load: int = 0


def test_cache_aware_routes_by_prefix_then_capacity_then_load():
    policy = CacheAwarePolicy(RouterConfig(cache_threshold=0.5, balance_abs_threshold=4, balance_rel_threshold=1.5))
    a, b = FakeWorker("a"), FakeWorker("b")
    sys_x, sys_y = "X" * 400, "Y" * 400
    first = policy.choose(sys_x + "question 1", [a, b])
    assert first.reason == CAPACITY  # nothing cached anywhere: the emptiest tree
    other = policy.choose(sys_y + "question 1", [a, b])
    assert other.reason == CAPACITY and other.worker is not first.worker  # now the other tree is emptier
    for i in range(2, 6):
        d = policy.choose(sys_x + f"question {i}", [a, b])
        assert (d.worker, d.reason) == (first.worker, PREFIX) and d.matched > 0.9
        d = policy.choose(sys_y + f"question {i}", [a, b])
        assert (d.worker, d.reason) == (other.worker, PREFIX)
    first.worker.load, other.worker.load = 10, 2  # 10 - 2 > 4 and 10 > 1.5 * 2: imbalanced
    d = policy.choose(sys_x + "question 9", [a, b])
    assert (d.worker, d.reason) == (other.worker, BALANCE)
    first.worker.load = 6  # 6 - 2 = 4: not beyond the absolute threshold
    assert policy.choose(sys_x + "question 10", [a, b]).worker is first.worker
    policy.forget(first.worker.url)  # its cache is gone (it restarted): no affinity to it is left
    assert policy.tree(first.worker.url).size == 0
    d = policy.choose(sys_x + "question 11", [a, b])  # the balanced-away request left sys_x on the other
    assert (d.worker, d.reason) == (other.worker, PREFIX)
