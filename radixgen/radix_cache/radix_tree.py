"""RadixCache: a radix tree from token-id prefixes to KV-cache slots (RadixAttention).

Follows "SGLang: Efficient Execution of Structured Language Model Programs" (Zheng et al., 2024),
section 3: every computed sequence's KV slots stay in a radix tree keyed by its token ids, so a new
request that shares a prefix reuses those slots instead of recomputing them. Nodes that running
requests use are locked (reference counted up to the root); unlocked leaves are evicted in LRU order
when the KV pool runs short.

- A node holds a run of token ids (`key`, a list) and their KV slots (`value`, int64 tensor, same
  length). Children are keyed by their first token (by their first page, a tuple, when
  `page_size > 1`); the root's children are keyed by `(extra_key, first token or page)`, so two
  namespaces never share a node.
- With `page_size > 1` every node's length is a multiple of `page_size`: keys are truncated to their
  page-aligned length before matching or inserting, and the caller keeps the unaligned tail.
- The tree never allocates KV. It returns slots to the `TokenAllocator` only when it evicts them,
  and the two engine helpers (`cache_finished_req`, `cache_unfinished_req`) free a request's
  duplicate slots, so that every slot is owned by exactly one of: the free list, the tree, a request.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from radixgen.radix_cache.memory_pool import TokenAllocator

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclass
class RadixKey:
    """Token ids plus an optional namespace; different `extra_key`s never share cached KV."""

    token_ids: list[int]
    extra_key: str | None = None


KeyLike = RadixKey | Sequence[int]


class TreeNode:
    """One edge of the radix tree: a run of tokens and their KV slots."""

    __slots__ = ("key", "value", "children", "parent", "lock_ref", "last_access", "extra_key")

    def __init__(
        self,
        key: list[int],
        value: torch.Tensor,
        parent: TreeNode | None,
        extra_key: str | None = None,
        lock_ref: int = 0,
        last_access: int = 0,
    ) -> None:
        self.key = key  # token ids
        self.value = value  # int64 [len(key)] KV slots
        self.children: dict[object, TreeNode] = {}
        self.parent = parent
        self.lock_ref = lock_ref
        self.last_access = last_access
        self.extra_key = extra_key

    def __repr__(self) -> str:
        return f"TreeNode(len={len(self.key)}, lock_ref={self.lock_ref}, ns={self.extra_key!r})"


@dataclass
class MatchResult:
    """Result of `match_prefix`; unpacks as `kv_indices, last_node = tree.match_prefix(key)`."""

    kv_indices: torch.Tensor  # int64 [n] KV slots of the matched prefix (owned by the tree)
    last_node: TreeNode  # deepest matched node (the root when nothing matched); lock this one

    @property
    def prefix_len(self) -> int:
        return int(self.kv_indices.numel())

    def __iter__(self) -> Iterator[object]:
        return iter((self.kv_indices, self.last_node))


class RadixCache:
    """Prefix tree over a token-granular KV pool; see the module docstring.

    `allocator` receives evicted and duplicate slots (None: they are just dropped, for tests of the
    structure alone). `disable=True` turns caching off: nothing is inserted or matched, and the
    engine helpers free all of a finished request's KV.
    """

    def __init__(self, allocator: TokenAllocator | None, page_size: int = 1, disable: bool = False) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self._clock = itertools.count(1)
        self.reset()

    # ----------------------------------------------------------------------------- bookkeeping

    def reset(self) -> None:
        """Drop every node. Does NOT free KV to the allocator: the engine clears the allocator itself
        (flush_cache); call it only when no request holds a lock on the tree."""
        self.root = TreeNode([], _EMPTY, None, lock_ref=1)  # lock_ref 1: the root is never evicted
        self._evictable = 0
        self._protected = 0

    def evictable_size(self) -> int:
        """Tokens in nodes with lock_ref == 0 (may be evicted, leaves first)."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in nodes locked by at least one running request."""
        return self._protected

    def total_size(self) -> int:
        """All tokens held by the tree (counted by a traversal, not from the two counters)."""
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += len(node.key)
            stack.extend(node.children.values())
        return total

    # ----------------------------------------------------------------------------- lookup

    def match_prefix(self, key: KeyLike) -> MatchResult:
        """Longest cached prefix of `key` (a multiple of page_size); splits a node matched partway so
        that `last_node` ends exactly at the match, and marks the matched path as recently used."""
        ids, extra = self._normalize(key)
        if self.disable or not ids:
            return MatchResult(_EMPTY, self.root)
        now = next(self._clock)
        node, pos, values = self.root, 0, []
        while pos < len(ids):
            child = node.children.get(self._child_key(node, ids, pos, extra))
            if child is None:
                break
            child.last_access = now
            n = self._match_len(child.key, ids, pos)
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            values.append(child.value)
            node, pos = child, pos + n
            if partial:
                break
        kv = torch.cat(values) if values else _EMPTY
        return MatchResult(kv, node)

    def insert(self, key: KeyLike, kv_indices: torch.Tensor) -> int:
        """Insert `key` -> `kv_indices` (int64, at least len(key) long); returns how many leading
        tokens were ALREADY cached. For those the tree keeps its own slots and the caller frees its
        duplicates; the tree takes ownership of the slots of the new part. With page_size > 1 only
        the page-aligned part is inserted (the caller keeps the tail). The stored slots are copied,
        so `kv_indices` may be a view of a row that is reused later."""
        ids, extra = self._normalize(key)
        if self.disable or not ids:
            return 0
        now = next(self._clock)
        node, pos = self.root, 0
        while pos < len(ids):
            child_key = self._child_key(node, ids, pos, extra)
            child = node.children.get(child_key)
            if child is None:
                leaf = TreeNode(ids[pos:], kv_indices[pos : len(ids)].clone(), node, extra, 0, now)
                node.children[child_key] = leaf
                self._evictable += len(leaf.key)
                return pos
            child.last_access = now
            n = self._match_len(child.key, ids, pos)
            if n < len(child.key):
                child = self._split(child, n)
            node, pos = child, pos + n
        return pos

    # ----------------------------------------------------------------------------- locks, eviction

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (a running request uses them)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`; nodes whose count drops to 0 become evictable."""
        while node is not self.root:
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node.lock_ref -= 1
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots by removing unlocked leaves, least recently used first
        (a parent left as an unlocked leaf joins the queue); returns how many were freed (fewer
        when nothing evictable is left)."""
        if self.disable or num_tokens <= 0:
            return 0
        tie = itertools.count()  # heap tiebreak: nodes are not comparable
        heap = [(leaf.last_access, next(tie), leaf) for leaf in self._evictable_leaves()]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            self._free(leaf.value)
            freed += len(leaf.key)
            self._evictable -= len(leaf.key)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._child_key(parent, leaf.key, 0, leaf.extra_key)]
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, next(tie), parent))
        return freed

    # ----------------------------------------------------------------------------- engine helpers

    def cache_finished_req(
        self,
        key: KeyLike,
        kv_indices: torch.Tensor,
        last_locked_node: TreeNode,
        locked_prefix_len: int | None = None,
    ) -> None:
        """Hand a finished request's KV to the tree and release its lock.

        `key` / `kv_indices` are the tokens whose KV was computed and their slots (equal lengths;
        the last sampled token has no KV yet, leave it out). `kv_indices[:locked_prefix_len]` are
        the tree's own slots the request got from `match_prefix` (or `cache_unfinished_req`) and
        locked at `last_locked_node`; `locked_prefix_len` defaults to that node's depth, which is
        the same number. Afterwards every slot of the request is owned by the tree or freed:
        the slots duplicating a part another request cached meanwhile
        (`[locked_prefix_len, already_cached)`) and, with page_size > 1, the unaligned tail.
        """
        ids, extra = self._check_req(key, kv_indices)
        locked = self._depth(last_locked_node) if locked_prefix_len is None else locked_prefix_len
        aligned = 0 if self.disable else len(ids) // self.page_size * self.page_size
        cached = self.insert(RadixKey(ids[:aligned], extra), kv_indices)
        self._free(kv_indices[locked:cached])  # duplicates of slots the tree already had
        self._free(kv_indices[aligned:])  # not inserted (unaligned tail, or everything if disabled)
        self.dec_lock_ref(last_locked_node)

    def cache_unfinished_req(
        self,
        key: KeyLike,
        kv_indices: torch.Tensor,
        last_locked_node: TreeNode,
        locked_prefix_len: int | None = None,
    ) -> tuple[torch.Tensor, TreeNode]:
        """Cache a still-running request's computed KV (chunked prefill, retraction) and move its lock.

        Arguments as in `cache_finished_req`. Inserts the page-aligned part, frees the request's
        duplicate slots, re-matches, locks the new last node and unlocks `last_locked_node`.
        Returns `(new_kv_indices, new_last_node)`: `new_kv_indices` has the same length as
        `kv_indices`: the tree's slots for the aligned part (some differ from the request's: write
        them back into its req_to_token row) followed by the request's own unaligned tail, which it
        still owns. The request's new locked prefix length is `len(key) // page_size * page_size`;
        pass `new_last_node` (and that length) to the next call. Disabled: returns the inputs.
        """
        ids, extra = self._check_req(key, kv_indices)
        if self.disable:
            return kv_indices, last_locked_node
        locked = self._depth(last_locked_node) if locked_prefix_len is None else locked_prefix_len
        aligned = len(ids) // self.page_size * self.page_size
        cached = self.insert(RadixKey(ids[:aligned], extra), kv_indices)
        self._free(kv_indices[locked:cached])
        match = self.match_prefix(RadixKey(ids[:aligned], extra))  # the tree's slots, all `aligned`
        self.inc_lock_ref(match.last_node)
        self.dec_lock_ref(last_locked_node)
        return torch.cat([match.kv_indices, kv_indices[aligned:]]), match.last_node

    # ----------------------------------------------------------------------------- display

    def pretty_print(self) -> str:
        """Print (and return) the tree, one node per line, indented by depth."""
        lines = [f"root  total={self.total_size()} evictable={self._evictable} protected={self._protected}"]

        def visit(node: TreeNode, depth: int) -> None:
            for child in node.children.values():
                shown = child.key if len(child.key) <= 12 else child.key[:12] + ["..."]
                ns = f" ns={child.extra_key!r}" if depth == 1 else ""
                lines.append(
                    f"{'  ' * depth}{shown} len={len(child.key)} lock={child.lock_ref} t={child.last_access}{ns}"
                )
                visit(child, depth + 1)

        visit(self.root, 1)
        text = "\n".join(lines)
        print(text)
        return text

    # ----------------------------------------------------------------------------- internals

    def _normalize(self, key: KeyLike, align: bool = True) -> tuple[list[int], str | None]:
        """(token ids as a list, truncated to whole pages unless `align` is False; namespace)."""
        if isinstance(key, RadixKey):
            ids, extra = key.token_ids, key.extra_key
        else:
            ids, extra = key, None
        if not isinstance(ids, list):
            ids = list(ids)
        if align and self.page_size > 1:
            ids = ids[: len(ids) - len(ids) % self.page_size]
        return ids, extra

    def _check_req(self, key: KeyLike, kv_indices: torch.Tensor) -> tuple[list[int], str | None]:
        ids, extra = self._normalize(key, align=False)
        if len(ids) != kv_indices.numel():
            raise ValueError(
                f"key has {len(ids)} tokens but kv_indices has {kv_indices.numel()} slots; pass only "
                "the tokens whose KV was computed"
            )
        return ids, extra

    def _child_key(self, node: TreeNode, ids: list[int], pos: int, extra: str | None) -> object:
        first = ids[pos] if self.page_size == 1 else tuple(ids[pos : pos + self.page_size])
        return (extra, first) if node is self.root else first

    def _match_len(self, node_key: list[int], ids: list[int], pos: int) -> int:
        """Common prefix length of `node_key` and `ids[pos:]`, rounded down to a page multiple."""
        end = min(len(node_key), len(ids) - pos)
        if node_key[:end] == ids[pos : pos + end]:  # common case, compared in C
            return end
        i = 0
        while node_key[i] == ids[pos + i]:
            i += 1
        return i - i % self.page_size

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after `n` tokens; the new upper node takes its place and is returned."""
        parent = child.parent
        assert parent is not None
        upper = TreeNode(child.key[:n], child.value[:n], parent, child.extra_key, child.lock_ref, child.last_access)
        parent.children[self._child_key(parent, child.key, 0, child.extra_key)] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[self._child_key(upper, child.key, 0, child.extra_key)] = child
        return upper

    def _evictable_leaves(self) -> list[TreeNode]:
        leaves, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.lock_ref == 0:
                leaves.append(node)
        return leaves

    def _depth(self, node: TreeNode) -> int:
        """Tokens from the root to the end of `node` (unchanged by splits; locked nodes stay)."""
        depth = 0
        while node is not self.root:
            depth += len(node.key)
            node = node.parent  # type: ignore[assignment]
        return depth

    def _free(self, indices: torch.Tensor) -> None:
        if self.allocator is not None and indices.numel():
            self.allocator.free(indices)
