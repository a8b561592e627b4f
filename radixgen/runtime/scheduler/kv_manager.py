"""KVManager: the one owner of KV state (slots, request rows, the radix tree, each request's KVState).

Every KV slot is owned by exactly one of: the free list, the radix tree, or a running request
(`req_to_token[pool_idx, locked_len:kv_len]`; the first `locked_len` slots of its row are the
tree's, locked at `last_node`). The scheduler's parts (admission, batch launch, output processing,
jump-forward) change KV only through this class, and `check` verifies that ownership, the tree's
lock counts and every row's agreement with the tree (the scheduler runs it after each step with
`debug_kv_check`; the unit tests run it after every step of random workloads).
"""

from __future__ import annotations

from collections import Counter

import torch

from radixgen.radix_cache.memory_pool import ReqToTokenPool, TableUpdate, TokenToKVPool
from radixgen.radix_cache.radix_tree import RadixCache, TreeNode
from radixgen.runtime.scheduler.request import KVState, Req


class KVIntegrityError(AssertionError):
    """The KV bookkeeping is inconsistent (a leaked or double-owned slot, unbalanced locks, ...)."""


class KVManager:
    """Allocation, prefix matching, locking, retraction, truncation and tree inserts."""

    def __init__(self, req_pool: ReqToTokenPool, kv_pool: TokenToKVPool, page_size: int = 1,
                 disable_radix_cache: bool = False) -> None:
        self.req_pool = req_pool
        self.kv_pool = kv_pool
        self.page_size = page_size
        self.tree = RadixCache(kv_pool.allocator, page_size, disable=disable_radix_cache)

    # ------------------------------------------------------------------ capacity

    @property
    def caching(self) -> bool:
        return not self.tree.disable

    @property
    def capacity(self) -> int:
        return self.kv_pool.size

    def available(self) -> int:
        """Slots that can be had now: free plus evictable from the tree."""
        return self.kv_pool.available_size() + self.tree.evictable_size()

    def free(self) -> int:
        """Slots free without evicting anything from the tree."""
        return self.kv_pool.available_size()

    def used(self) -> int:
        return self.kv_pool.size - self.kv_pool.available_size()

    def evictable(self) -> int:
        return self.tree.evictable_size()

    def has_free_row(self) -> bool:
        return self.req_pool.available_size() > 0

    def cached_prefix_len(self, req: Req) -> int:
        """How much of the request's cacheable prefix the tree holds (marks it recently used)."""
        return self.tree.match_prefix(req.radix_key(req.prefix_cap())).prefix_len

    # ------------------------------------------------------------------ admission

    def match(self, req: Req) -> int:
        """Lock the request's longest cached prefix; returns its length."""
        m = self.tree.match_prefix(req.radix_key(req.prefix_cap()))
        self.tree.inc_lock_ref(m.last_node)
        req.kv = KVState(kv_len=m.prefix_len, done_kv_len=m.prefix_len, locked_len=m.prefix_len,
                         last_node=m.last_node, matched=m.kv_indices)
        return m.prefix_len

    def unmatch(self, req: Req) -> None:
        """Undo `match` for a request that is not admitted after all."""
        self.tree.dec_lock_ref(req.kv.last_node)
        req.kv = KVState()

    def admit(self, req: Req) -> None:
        """Give a matched request its req_to_token row, starting with the matched prefix's slots."""
        kv = req.kv
        kv.pool_idx = self.req_pool.alloc()
        self.req_pool.write(kv.pool_idx, 0, kv.matched)
        kv.matched = None

    # ------------------------------------------------------------------ a step

    def allocate(self, reqs: list[Req], lens: list[int]) -> tuple[torch.Tensor, list[int]] | None:
        """Slots for the next `lens[i]` tokens of each request (evicting from the tree if needed),
        written into their rows. Returns (slots [sum(lens)], each request's KV length before), or
        None when the pool cannot hold them."""
        n = sum(lens)
        short = n - self.kv_pool.available_size()
        if short > 0:
            self.tree.evict(short)
        loc = self.kv_pool.alloc(n)
        if loc is None:
            return None
        starts = [req.kv.kv_len for req in reqs]
        self.req_pool.write_runs([req.kv.pool_idx for req in reqs], starts, lens, loc)
        for req, k in zip(reqs, lens, strict=True):
            req.kv.kv_len += k
        return loc, starts

    def take_table_update(self) -> TableUpdate | None:
        """The req_to_token writes since the last call, for the next batch to apply on the device."""
        return self.req_pool.take_updates()

    def computed(self, req: Req, n: int) -> None:
        """`n` more of the request's scheduled tokens have their KV computed."""
        req.kv.done_kv_len += n

    # ------------------------------------------------------------------ the tree

    def cache_unfinished(self, req: Req) -> None:
        """Put the request's computed KV in the tree (other requests may share it now) and move its lock."""
        kv = req.kv
        done = kv.done_kv_len  # a later chunk may be in flight: insert only computed KV
        if kv.truncate_to is not None:  # and none that a pending cut drops (rejected drafts' KV)
            done = min(done, kv.truncate_to)
        slots = self.req_pool.req_to_token[kv.pool_idx, :done].clone()
        new_slots, node = self.tree.cache_unfinished_req(req.radix_key(done), slots, kv.last_node, kv.locked_len)
        self.req_pool.write(kv.pool_idx, 0, new_slots)
        if self.caching:
            kv.last_node = node
            kv.locked_len = done // self.page_size * self.page_size

    def release(self, req: Req) -> None:
        """Hand the request's KV to the tree (or free it) and give back its row; nothing of the
        request may be in flight. A retracted request resumes later from what the tree kept."""
        kv = req.kv
        if kv.pool_idx is None:
            if kv.last_node is not None:
                self.unmatch(req)
            return
        # KV of tokens a jump-forward replaced, or of drafts past the sequence's end, must not reach the tree
        self.truncate(req, req.seq_len, idle=True)
        slots = self.req_pool.req_to_token[kv.pool_idx, : kv.kv_len].clone()  # all computed
        self.tree.cache_finished_req(req.radix_key(kv.kv_len), slots, kv.last_node, kv.locked_len)
        self.req_pool.free(kv.pool_idx)
        req.kv = KVState()

    # ------------------------------------------------------------------ jump-forward

    def truncate(self, req: Req, length: int, idle: bool) -> None:
        """Cut the request's KV back to `length` tokens (a jump-forward replaced the tokens after it,
        or they were rejected drafts): now when nothing of it is in flight (`idle`), else once it is
        (`apply_truncate`; a cut already pending there still applies if it is shorter)."""
        kv = req.kv
        kv.truncate_to = min(kv.kv_len, length, kv.truncate_to if kv.truncate_to is not None else length)
        if idle:
            self.apply_truncate(req)

    def apply_truncate(self, req: Req) -> None:
        """Carry out a pending `truncate` (nothing of the request is in flight)."""
        kv = req.kv
        target = kv.truncate_to
        if target is not None and target < kv.kv_len:
            self.kv_pool.free(self.req_pool.req_to_token[kv.pool_idx, target : kv.kv_len].clone())
            kv.kv_len = kv.done_kv_len = target
        kv.truncate_to = None

    # ------------------------------------------------------------------ whole pool

    def flush(self) -> None:
        """Drop the tree and free every slot and row (no request may hold any)."""
        self.tree.reset()
        self.kv_pool.allocator.clear()
        self.req_pool.clear()

    def check(self, reqs: list[Req]) -> None:
        """Raise KVIntegrityError unless every slot has exactly one owner, every tree lock is held
        by a request, the tree's counters add up, and each row's tree part equals the tree's slots.
        `reqs`: every request the scheduler holds (running and waiting)."""
        size = self.kv_pool.size
        owners = [self.kv_pool.allocator.free_slots()]
        nodes = _nodes(self.tree)
        owners += [n.value for n in nodes]
        rows = Counter()
        expected_locks: Counter[int] = Counter()
        for req in reqs:
            kv = req.kv
            if kv.last_node is not None:
                node = kv.last_node
                while node is not self.tree.root:
                    expected_locks[id(node)] += 1
                    node = node.parent
            if kv.pool_idx is None:
                if kv.kv_len or kv.locked_len:
                    raise KVIntegrityError(f"request {req.rid} has KV length {kv.kv_len} but no row")
                continue
            rows[kv.pool_idx] += 1
            row = self.req_pool.req_to_token[kv.pool_idx]
            owners.append(row[kv.locked_len : kv.kv_len])
            if kv.last_node is not None:
                path = _path_slots(self.tree, kv.last_node)
                if path.numel() != kv.locked_len or not torch.equal(row[: kv.locked_len], path):
                    raise KVIntegrityError(f"request {req.rid}: the first {kv.locked_len} slots of its row are "
                                           f"not the tree's slots for its locked prefix ({path.numel()})")
        if any(c > 1 for c in rows.values()):
            raise KVIntegrityError("two requests share a req_to_token row")
        if len(rows) + self.req_pool.available_size() != self.req_pool.size:
            raise KVIntegrityError(f"{len(rows)} rows in use + {self.req_pool.available_size()} free != "
                                   f"{self.req_pool.size}")
        slots = torch.cat([o.reshape(-1) for o in owners])
        counts = torch.bincount(slots, minlength=size + 1)
        if counts[0] != 0:
            raise KVIntegrityError("the padding slot 0 is owned")
        if (counts[1:] == 0).any():
            raise KVIntegrityError(f"leaked KV slots (no owner): {(counts[1:] == 0).nonzero()[:8, 0] + 1}")
        if (counts > 1).any():
            raise KVIntegrityError(f"KV slots with several owners: {(counts > 1).nonzero()[:8, 0]}")
        evictable = protected = 0
        for n in nodes:
            if n.lock_ref != expected_locks[id(n)]:
                raise KVIntegrityError(f"tree node {n} has lock_ref {n.lock_ref}, requests hold "
                                       f"{expected_locks[id(n)]}")
            evictable += len(n.key) if n.lock_ref == 0 else 0
            protected += len(n.key) if n.lock_ref > 0 else 0
        if (evictable, protected) != (self.tree.evictable_size(), self.tree.protected_size()):
            raise KVIntegrityError(f"tree counters (evictable {self.tree.evictable_size()}, protected "
                                   f"{self.tree.protected_size()}) != counted ({evictable}, {protected})")


def _nodes(tree: RadixCache) -> list[TreeNode]:
    out, stack = [], list(tree.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def _path_slots(tree: RadixCache, node: TreeNode) -> torch.Tensor:
    """The KV slots from the root down to the end of `node`."""
    parts = []
    while node is not tree.root:
        parts.append(node.value)
        node = node.parent
    return torch.cat(parts[::-1]) if parts else torch.empty(0, dtype=torch.int64)
