"""An approximate prefix tree of the prompts sent to one replica (the router's guess at its cache).

A radix tree over characters (or token ids, for requests given as ids) with a last-use tick on every
node. `match` says how much of a prompt the tree holds; `insert` adds a prompt and marks its path
used; beyond `max_size` elements the least recently used leaves are evicted (down to 90% of it, so
eviction is amortized), which keeps the router's memory bounded however many prompts pass. Like
SGLang's router tree it stores text, not tokens, so the router needs no tokenizer; it can drift from
the replica's real cache (which evicts on its own), hence "approximate".
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

Key = Sequence  # a str or a tuple of token ids


class _Node:
    __slots__ = ("edge", "children", "parent", "tick")

    def __init__(self, edge: Key, parent: _Node | None, tick: int) -> None:
        self.edge = edge  # the elements from the parent to this node
        self.children: dict[object, _Node] = {}  # first element of the child's edge -> child
        self.parent = parent
        self.tick = tick


def _common(a: Key, b: Key) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixTree:
    """Prompts routed to one replica, at most `max_size` elements (characters or ids) in all."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._clock = itertools.count(1)
        self.clear()

    def clear(self) -> None:
        self.root = _Node((), None, 0)
        self.size = 0  # elements stored over all edges
        self.nodes = 1

    def match(self, key: Key) -> int:
        """Length of the longest prefix of `key` in the tree (changes nothing)."""
        node, i = self.root, 0
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                break
            n = _common(child.edge, key[i:])
            i += n
            if n < len(child.edge):
                break
            node = child
        return i

    def insert(self, key: Key) -> None:
        """Add `key`, marking every node on its path as just used; evict if over `max_size`."""
        tick = next(self._clock)
        node, i = self.root, 0
        node.tick = tick
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                leaf = _Node(key[i:], node, tick)
                node.children[key[i]] = leaf
                self.size += len(leaf.edge)
                self.nodes += 1
                break
            n = _common(child.edge, key[i:])
            if n < len(child.edge):  # split the edge at n
                mid = _Node(child.edge[:n], node, tick)
                node.children[key[i]] = mid
                child.edge, child.parent = child.edge[n:], mid
                mid.children[child.edge[0]] = child
                self.nodes += 1
                child = mid
            child.tick = tick
            node, i = child, i + n
        if self.size > self.max_size:
            self.evict(self.size - int(self.max_size * 0.9))

    def evict(self, amount: int) -> None:
        """Remove least recently used leaves until `amount` elements are gone (or the tree is empty)."""
        while amount > 0 and self.root.children:
            leaves = sorted(self._leaves(), key=lambda n: n.tick)
            for leaf in leaves:
                if amount <= 0:
                    break
                amount -= len(leaf.edge)
                self._remove(leaf)

    def _leaves(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out

    def _remove(self, leaf: _Node) -> None:
        parent = leaf.parent
        del parent.children[leaf.edge[0]]
        self.size -= len(leaf.edge)
        self.nodes -= 1
