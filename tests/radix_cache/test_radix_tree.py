"""RadixCache against a naive reference cache (Hypothesis stateful test) plus unit tests.

The reference keeps, per namespace, a dict from every cached prefix (a tuple of token ids) to the
KV slot of its last token; longest-prefix match is a loop over growing prefixes. It shares no code
with the tree. A checking allocator records every slot it hands out and takes back, so a slot that
leaks or is freed twice fails the test at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixgen.radix_cache.memory_pool import TokenAllocator
from radixgen.radix_cache.radix_tree import MatchResult, RadixCache, RadixKey, TreeNode

CAPACITY = 48


class CheckedAllocator(TokenAllocator):
    """TokenAllocator that mirrors its free list in a set and logs every freed slot."""

    def clear(self) -> None:
        super().clear()
        self.free_set = set(range(1, self.size + 1))
        self.freed_log: list[int] = []

    def alloc(self, n: int) -> torch.Tensor | None:
        out = super().alloc(n)
        if out is not None:
            for slot in out.tolist():
                assert slot in self.free_set, f"slot {slot} handed out while in use"
                self.free_set.remove(slot)
        return out

    def free(self, indices: torch.Tensor) -> None:
        slots = indices.tolist()
        assert indices.dtype == torch.int64
        assert len(set(slots)) == len(slots), f"duplicate slots in one free: {slots}"
        for slot in slots:
            assert 1 <= slot <= self.size, f"slot {slot} out of range"
            assert slot not in self.free_set, f"slot {slot} freed twice"
        self.free_set.update(slots)
        self.freed_log.extend(slots)
        super().free(indices)


class RefCache:
    """Naive reference, one page at a time: namespace -> {prefix as a tuple of pages: the slots of
    its last page}. With page_size 1 a page is one token."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.prefixes: dict[str | None, dict[tuple[tuple[int, ...], ...], tuple[int, ...]]] = {}

    def aligned(self, n: int) -> int:
        return n - n % self.page_size

    def pages(self, seq: list[int]) -> list[tuple[int, ...]]:
        ps = self.page_size
        return [tuple(seq[i : i + ps]) for i in range(0, self.aligned(len(seq)), ps)]

    def match(self, ns: str | None, ids: list[int]) -> list[int]:
        table, pages = self.prefixes.get(ns, {}), self.pages(ids)
        out: list[int] = []
        for j in range(len(pages)):
            slots = table.get(tuple(pages[: j + 1]))
            if slots is None:
                break
            out.extend(slots)
        return out

    def insert(self, ns: str | None, ids: list[int], kv: list[int]) -> int:
        """Insert the aligned part; return how many leading tokens were already there."""
        table, pages, kv_pages = self.prefixes.setdefault(ns, {}), self.pages(ids), self.pages(kv)
        cached = len(self.match(ns, ids))
        for j in range(cached // self.page_size, len(pages)):
            table[tuple(pages[: j + 1])] = kv_pages[j]
        return cached

    def drop_slots(self, slots: set[int]) -> None:
        for table in self.prefixes.values():
            for prefix, page_slots in list(table.items()):
                dropped = [s in slots for s in page_slots]
                assert all(dropped) or not any(dropped), "eviction split a page"
                if dropped[0]:
                    del table[prefix]

    def slots(self) -> set[int]:
        return {s for table in self.prefixes.values() for page in table.values() for s in page}


def tree_contents(tree: RadixCache) -> dict:
    """The tree's content in the reference's shape, read off its nodes."""
    ps, out = tree.page_size, {}
    stack: list[tuple[TreeNode, tuple]] = [(c, ()) for c in tree.root.children.values()]
    while stack:
        node, prefix = stack.pop()
        table = out.setdefault(node.extra_key, {})
        slots = node.value.tolist()
        for i in range(0, len(node.key), ps):
            prefix = prefix + (tuple(node.key[i : i + ps]),)
            table[prefix] = tuple(slots[i : i + ps])
        stack.extend((c, prefix) for c in node.children.values())
    return {ns: t for ns, t in out.items() if t}


def all_nodes(tree: RadixCache) -> list[TreeNode]:
    nodes, stack = [], list(tree.root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes


def depth(tree: RadixCache, node: TreeNode) -> int:
    n = 0
    while node is not tree.root:
        assert node.parent is not None and node in node.parent.children.values(), "detached node"
        n += len(node.key)
        node = node.parent
    return n


def make_key(ns: str | None, ids: list[int]) -> RadixKey | list[int]:
    return ids if ns is None else RadixKey(ids, ns)


@dataclass
class Req:
    ns: str | None
    ids: list[int]
    kv: torch.Tensor  # [len(ids)]: kv[:locked_len] belong to the tree, the rest to the request
    node: TreeNode
    locked_len: int


token_lists = st.lists(st.integers(0, 3), max_size=12)
namespaces = st.sampled_from([None, "ns"])


class RadixMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.alloc = CheckedAllocator(CAPACITY)
        self.tree = RadixCache(self.alloc, page_size=page_size)
        self.ref = RefCache(page_size)
        self.locks: list[tuple[TreeNode, str | None, list[int], list[int]]] = []
        self.reqs: list[Req] = []

    # -- helpers

    def evict(self, n: int) -> int:
        mark, evictable = len(self.alloc.freed_log), self.tree.evictable_size()
        freed = self.tree.evict(n)
        slots = self.alloc.freed_log[mark:]
        assert freed == len(slots) <= evictable
        assert freed >= n or self.tree.evictable_size() == 0
        self.ref.drop_slots(set(slots))
        return freed

    def alloc_or_evict(self, n: int) -> torch.Tensor | None:
        out = self.alloc.alloc(n)
        if out is None:
            self.evict(n - self.alloc.available_size())
            out = self.alloc.alloc(n)
        return out

    def match(self, ns: str | None, ids: list[int]) -> MatchResult:
        expected = self.ref.match(ns, ids)
        result = self.tree.match_prefix(make_key(ns, ids))
        assert result.kv_indices.dtype == torch.int64
        assert result.kv_indices.tolist() == expected
        kv, node = result
        assert kv is result.kv_indices and depth(self.tree, node) == len(expected)
        return result

    # -- rules

    @rule(ns=namespaces, ids=token_lists)
    def insert(self, ns: str | None, ids: list[int]) -> None:
        kv = self.alloc_or_evict(len(ids))
        if kv is None:
            return
        cached = self.tree.insert(make_key(ns, ids), kv)
        assert cached == self.ref.insert(ns, ids, kv.tolist())
        self.alloc.free(kv[:cached])  # fresh slots: the cached part is all duplicates
        self.alloc.free(kv[self.ref.aligned(len(ids)) :])

    @rule(ns=namespaces, ids=token_lists)
    def match_prefix(self, ns: str | None, ids: list[int]) -> None:
        self.match(ns, ids)

    @rule(ns=namespaces, ids=token_lists)
    def lock(self, ns: str | None, ids: list[int]) -> None:
        kv, node = self.match(ns, ids)
        self.tree.inc_lock_ref(node)
        self.locks.append((node, ns, ids[: len(kv)], kv.tolist()))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i: int) -> None:
        node, *_ = self.locks.pop(i % len(self.locks))
        self.tree.dec_lock_ref(node)

    @rule(n=st.integers(0, CAPACITY))
    def evict_tokens(self, n: int) -> None:
        self.evict(n)

    @rule(ns=namespaces, ids=token_lists)
    def start_req(self, ns: str | None, ids: list[int]) -> None:
        prefix_kv, node = self.match(ns, ids)
        self.tree.inc_lock_ref(node)
        new_kv = self.alloc_or_evict(len(ids) - len(prefix_kv))
        if new_kv is None:
            self.tree.dec_lock_ref(node)
            return
        self.reqs.append(Req(ns, ids, torch.cat([prefix_kv, new_kv]), node, len(prefix_kv)))

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 100), more=st.lists(st.integers(0, 3), min_size=1, max_size=4))
    def extend_req(self, i: int, more: list[int]) -> None:
        req = self.reqs[i % len(self.reqs)]
        kv = self.alloc_or_evict(len(more))
        if kv is not None:
            req.ids = req.ids + more
            req.kv = torch.cat([req.kv, kv])

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 100), pass_len=st.booleans())
    def finish_req(self, i: int, pass_len: bool) -> None:
        req = self.reqs.pop(i % len(self.reqs))
        aligned, kv = self.ref.aligned(len(req.ids)), req.kv.tolist()
        mark = len(self.alloc.freed_log)
        self.tree.cache_finished_req(make_key(req.ns, req.ids), req.kv, req.node, req.locked_len if pass_len else None)
        cached = self.ref.insert(req.ns, req.ids, kv)
        assert cached >= req.locked_len
        assert sorted(self.alloc.freed_log[mark:]) == sorted(kv[req.locked_len : cached] + kv[aligned:])

    @precondition(lambda self: self.reqs)
    @rule(i=st.integers(0, 100), pass_len=st.booleans())
    def cache_unfinished(self, i: int, pass_len: bool) -> None:
        req = self.reqs[i % len(self.reqs)]
        aligned, kv = self.ref.aligned(len(req.ids)), req.kv.tolist()
        mark = len(self.alloc.freed_log)
        new_kv, new_node = self.tree.cache_unfinished_req(
            make_key(req.ns, req.ids), req.kv, req.node, req.locked_len if pass_len else None
        )
        cached = self.ref.insert(req.ns, req.ids, kv)
        assert sorted(self.alloc.freed_log[mark:]) == sorted(kv[req.locked_len : cached])
        assert new_kv.tolist() == self.ref.match(req.ns, req.ids) + kv[aligned:]
        assert depth(self.tree, new_node) == aligned
        req.kv, req.node, req.locked_len = new_kv, new_node, aligned

    @precondition(lambda self: not self.locks and not self.reqs)
    @rule(r=st.integers(0, 3))
    def reset(self, r: int) -> None:
        if r == 0:  # keep resets rare
            self.tree.reset()
            self.alloc.clear()  # the engine clears the allocator itself; reset frees nothing
            self.ref = RefCache(self.tree.page_size)

    # -- invariants

    @invariant()
    def sizes_add_up(self) -> None:
        tree = self.tree
        assert tree.evictable_size() + tree.protected_size() == tree.total_size()
        held = sum(len(r.ids) - r.locked_len for r in self.reqs)
        assert self.alloc.available_size() + tree.total_size() + held == CAPACITY
        assert len(self.alloc.free_set) == self.alloc.available_size()

    @invariant()
    def contents_match_reference(self) -> None:
        assert tree_contents(self.tree) == {ns: t for ns, t in self.ref.prefixes.items() if t}
        for table in self.ref.prefixes.values():
            assert all(len(p) == 1 or p[:-1] in table for p in table), "reference not prefix-closed"

    @invariant()
    def slots_owned_once(self) -> None:
        tree_slots = self.ref.slots()
        req_slots = [s for r in self.reqs for s in r.kv[r.locked_len :].tolist()]
        assert len(set(req_slots)) == len(req_slots)
        assert not tree_slots & self.alloc.free_set
        assert not set(req_slots) & (tree_slots | self.alloc.free_set)

    @invariant()
    def locks_hold(self) -> None:
        expected: dict[int, int] = {}
        locked_nodes = [n for n, *_ in self.locks] + [r.node for r in self.reqs]
        for node in locked_nodes:
            while node is not self.tree.root:
                expected[id(node)] = expected.get(id(node), 0) + 1
                node = node.parent
        ps, protected = self.tree.page_size, 0
        for node in all_nodes(self.tree):
            assert len(node.key) == node.value.numel() > 0 and len(node.key) % ps == 0
            assert node.lock_ref == expected.get(id(node), 0)
            protected += len(node.key) if node.lock_ref else 0
        assert protected == self.tree.protected_size()
        for node, ns, ids, kv in self.locks:  # locked prefixes survive every eviction, unchanged
            assert self.ref.match(ns, ids) == kv and depth(self.tree, node) == len(ids)
        for r in self.reqs:
            assert self.ref.match(r.ns, r.ids[: r.locked_len]) == r.kv[: r.locked_len].tolist()
            assert depth(self.tree, r.node) == r.locked_len


RadixMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestRadixMachine = RadixMachine.TestCase


# ------------------------------------------------------------------------------------- unit tests


def kv(*slots: int) -> torch.Tensor:
    return torch.tensor(slots, dtype=torch.int64)


def test_split_on_partial_match() -> None:
    tree = RadixCache(None)
    assert tree.insert([1, 2, 3, 4], kv(10, 11, 12, 13)) == 0
    result = tree.match_prefix([1, 2, 9])
    assert isinstance(result, MatchResult) and result.prefix_len == 2
    indices, node = result
    assert indices.tolist() == [10, 11] and node.key == [1, 2]
    (child,) = node.children.values()
    assert child.key == [3, 4] and child.value.tolist() == [12, 13] and child.parent is node
    assert tree.total_size() == 4 and tree.evictable_size() == 4
    assert tree.match_prefix([1, 2, 3, 4, 5]).kv_indices.tolist() == [10, 11, 12, 13]
    assert tree.match_prefix([]).last_node is tree.root


def test_insert_returns_prior_prefix_and_keeps_old_indices() -> None:
    tree = RadixCache(None)
    assert tree.insert([1, 2, 3], kv(1, 2, 3)) == 0
    assert tree.insert([1, 2, 3, 4, 5], kv(7, 7, 7, 4, 5)) == 3
    assert tree.insert([1, 2, 9], kv(8, 8, 9)) == 2
    assert tree.insert([1, 2, 3], kv(6, 6, 6)) == 3
    assert tree.match_prefix([1, 2, 3, 4, 5]).kv_indices.tolist() == [1, 2, 3, 4, 5]
    assert tree.match_prefix([1, 2, 9]).kv_indices.tolist() == [1, 2, 9]
    assert tree.total_size() == 6


def test_insert_copies_indices() -> None:
    tree, row = RadixCache(None), kv(1, 2, 3)
    tree.insert([5, 6, 7], row)
    row.fill_(0)  # the engine reuses req_to_token rows
    assert tree.match_prefix([5, 6, 7]).kv_indices.tolist() == [1, 2, 3]


def test_namespaces_are_isolated() -> None:
    tree = RadixCache(None)
    assert tree.insert(RadixKey([1, 2, 3], "a"), kv(1, 2, 3)) == 0
    assert tree.match_prefix([1, 2, 3]).prefix_len == 0
    assert tree.match_prefix(RadixKey([1, 2, 3], "b")).prefix_len == 0
    assert tree.insert(RadixKey([1, 2, 3], "b"), kv(4, 5, 6)) == 0
    assert tree.insert([1, 2], kv(7, 8)) == 0
    assert tree.match_prefix(RadixKey([1, 2, 3], "a")).kv_indices.tolist() == [1, 2, 3]
    assert tree.match_prefix(RadixKey([1, 2, 3], "b")).kv_indices.tolist() == [4, 5, 6]
    assert tree.match_prefix(RadixKey([1, 2, 3])).kv_indices.tolist() == [7, 8]
    assert len(tree.root.children) == 3 and "'b'" in tree.pretty_print()


def test_page_aligned_match_and_insert() -> None:
    tree = RadixCache(None, page_size=4)
    ids = list(range(10))
    assert tree.insert(ids, torch.arange(100, 110)) == 0
    assert tree.total_size() == 8  # the unaligned tail [8, 9] stays with the caller
    # a mismatch inside the second page rounds down to the first page boundary (and splits there)
    indices, node = tree.match_prefix([0, 1, 2, 3, 4, 5, 9, 9])
    assert indices.tolist() == [100, 101, 102, 103] and node.key == [0, 1, 2, 3]
    assert tree.match_prefix(ids[:7]).kv_indices.tolist() == [100, 101, 102, 103]
    assert tree.match_prefix(ids).prefix_len == 8
    assert tree.insert([0, 1, 2, 3, 4, 9, 9, 9], torch.arange(200, 208)) == 4
    assert tree.total_size() == 12
    assert tree.match_prefix([0, 1, 2, 3, 4, 9, 9, 9]).kv_indices.tolist() == [100, 101, 102, 103] + list(
        range(204, 208)
    )
    assert tree.match_prefix([0, 1, 2]).prefix_len == 0


def test_lru_eviction_order_and_cascade() -> None:
    alloc = TokenAllocator(32)
    tree = RadixCache(alloc)

    def put(ids: list[int]) -> None:
        slots = alloc.alloc(len(ids))
        assert slots is not None
        alloc.free(slots[: tree.insert(ids, slots)])

    put([1, 1])
    put([2, 2])
    put([3, 3])
    tree.match_prefix([1, 1])  # now [2, 2] is the least recently used
    assert tree.evict(1) == 2
    assert tree.match_prefix([2, 2]).prefix_len == 0 and tree.match_prefix([3, 3]).prefix_len == 2
    assert tree.evict(2) == 2 and tree.match_prefix([1, 1]).prefix_len == 0
    assert tree.evict(10) == 2 and tree.total_size() == 0 and alloc.available_size() == 32
    put([5, 6, 7, 8])
    put([5, 6, 9, 9])  # splits into [5, 6] -> {[7, 8], [9, 9]}
    assert tree.evict(5) == 6  # both leaves, then the parent that became a leaf
    assert tree.total_size() == 0 and alloc.available_size() == 32


def test_locked_nodes_survive_eviction() -> None:
    alloc = TokenAllocator(16)
    tree = RadixCache(alloc)
    for ids in ([1, 2, 3, 4], [1, 2, 5, 6]):
        slots = alloc.alloc(4)
        assert slots is not None
        alloc.free(slots[: tree.insert(ids, slots)])
    _, node = tree.match_prefix([1, 2, 3, 4])
    tree.inc_lock_ref(node)
    assert tree.protected_size() == 4 and tree.evictable_size() == 2
    tree.match_prefix([1, 2, 3, 9])  # splits the locked leaf [3, 4]: both halves stay locked
    assert tree.protected_size() == 4 and tree.evictable_size() == 2
    assert tree.evict(100) == 2
    assert tree.match_prefix([1, 2, 3, 4]).prefix_len == 4
    tree.dec_lock_ref(node)
    assert tree.protected_size() == 0 and tree.evictable_size() == 4
    assert tree.evict(3) == 4 and alloc.available_size() == 16


def test_disable_mode() -> None:
    alloc = TokenAllocator(8)
    tree = RadixCache(alloc, disable=True)
    slots = alloc.alloc(4)
    assert slots is not None
    assert tree.insert([1, 2, 3, 4], slots) == 0 and tree.total_size() == 0
    kv_, node = tree.match_prefix([1, 2, 3, 4])
    assert kv_.numel() == 0 and node is tree.root
    assert tree.evict(10) == 0
    new_kv, new_node = tree.cache_unfinished_req([1, 2, 3, 4], slots, tree.root, 0)
    assert new_kv is slots and new_node is tree.root and alloc.available_size() == 4
    tree.cache_finished_req([1, 2, 3, 4], slots, tree.root)
    assert alloc.available_size() == 8  # nothing cached: the finished request's KV is all freed


def test_reset_does_not_free() -> None:
    alloc = TokenAllocator(8)
    tree = RadixCache(alloc)
    slots = alloc.alloc(3)
    assert slots is not None
    tree.insert([1, 2, 3], slots)
    tree.reset()
    assert tree.total_size() == tree.evictable_size() == 0 and alloc.available_size() == 5
    assert tree.match_prefix([1, 2, 3]).prefix_len == 0


@pytest.mark.parametrize("pass_len", [True, False])
def test_cache_finished_req_frees_exactly_the_duplicates(pass_len: bool) -> None:
    alloc = CheckedAllocator(32)
    tree = RadixCache(alloc)
    ids = list(range(1, 9))
    a = alloc.alloc(8)
    assert a is not None
    tree.cache_finished_req(ids, a, tree.root)  # nothing matched: the tree takes all 8
    assert alloc.available_size() == 24 and tree.total_size() == 8

    # B matches those 8 and computes 2 more; meanwhile C caches the same 10 tokens and one more
    b_prefix, b_node = tree.match_prefix(ids + [9, 10])
    tree.inc_lock_ref(b_node)
    b = torch.cat([b_prefix, alloc.alloc(2)])
    c_prefix, c_node = tree.match_prefix(ids + [9, 10, 11])
    tree.inc_lock_ref(c_node)
    tree.cache_finished_req(ids + [9, 10, 11], torch.cat([c_prefix, alloc.alloc(3)]), c_node)
    assert alloc.available_size() == 32 - 8 - 2 - 3 and tree.protected_size() == 8

    mark = len(alloc.freed_log)
    tree.cache_finished_req(ids + [9, 10], b, b_node, 8 if pass_len else None)
    assert alloc.freed_log[mark:] == b[8:].tolist()  # B's own two slots duplicated C's
    assert tree.protected_size() == 0 and tree.total_size() == 11
    assert alloc.available_size() + tree.total_size() == 32


def test_cache_finished_req_page_tail() -> None:
    alloc = CheckedAllocator(16)
    tree = RadixCache(alloc, page_size=4)
    slots = alloc.alloc(10)
    assert slots is not None
    tree.cache_finished_req(RadixKey(list(range(10)), "x"), slots, tree.root)
    assert alloc.freed_log == slots[8:].tolist() and tree.total_size() == 8
    with pytest.raises(ValueError, match="kv_indices"):
        tree.cache_finished_req(list(range(3)), slots[:2], tree.root)


def test_cache_unfinished_req_swaps_in_tree_indices() -> None:
    alloc = CheckedAllocator(32)
    tree = RadixCache(alloc)
    x_ids = [1, 2, 3, 4, 5, 6, 7, 8]
    x = alloc.alloc(8)
    assert x is not None
    tree.cache_finished_req(x_ids, x, tree.root)

    # Y started before X was cached (matched nothing) and has computed 6 tokens X also has
    y = alloc.alloc(6)
    assert y is not None
    mark = len(alloc.freed_log)
    new_kv, node = tree.cache_unfinished_req(x_ids[:6], y, tree.root, 0)
    assert alloc.freed_log[mark:] == y.tolist()  # all six were duplicates
    assert new_kv.tolist() == x[:6].tolist() and node.key == x_ids[:6]
    assert tree.protected_size() == 6 and tree.evict(100) == 2  # only X's unlocked tail goes

    # next chunk: two tokens of its own; caching again moves the lock down
    y2 = alloc.alloc(2)
    assert y2 is not None
    y_ids, y_kv = x_ids[:6] + [9, 9], torch.cat([new_kv, y2])
    mark = len(alloc.freed_log)
    new_kv, node2 = tree.cache_unfinished_req(y_ids, y_kv, node)
    assert alloc.freed_log[mark:] == [] and new_kv.tolist() == y_kv.tolist()
    assert node2.lock_ref == 1 and node.lock_ref == 1 and tree.protected_size() == 8
    tree.cache_finished_req(y_ids, new_kv, node2, 8)
    assert tree.protected_size() == 0 and alloc.available_size() + tree.total_size() == 32


def test_cache_unfinished_req_keeps_page_tail() -> None:
    alloc = CheckedAllocator(16)
    tree = RadixCache(alloc, page_size=4)
    slots = alloc.alloc(6)
    assert slots is not None
    new_kv, node = tree.cache_unfinished_req(list(range(6)), slots, tree.root, 0)
    assert new_kv.tolist() == slots.tolist() and alloc.freed_log == []
    assert tree.total_size() == 4 and tree.protected_size() == 4 and node.key == [0, 1, 2, 3]
    tree.cache_finished_req(list(range(6)), new_kv, node, 4)
    assert alloc.freed_log == slots[4:].tolist() and alloc.available_size() == 12
