"""Prompt-lookup drafts: continue the sequence the way it continued after the last earlier
occurrence of its longest recent suffix (prompt lookup decoding; vLLM's n-gram proposer and
llama.cpp's `LlamaPromptLookupDecoding` propose the same way).

`NgramIndex` keeps, for every n-gram of length min_n..max_n in a request's tokens, the position
just after its most recent occurrence, so a lookup is max_n - min_n + 1 dictionary probes instead
of a scan of the sequence, and appending a token costs max_n - min_n + 1 inserts.
"""

from __future__ import annotations


class NgramIndex:
    """The n-grams of one growing token sequence (the request's prompt + output)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram match lengths must satisfy 1 <= min <= max, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> position after its latest occurrence

    def sync(self, seq: list[int]) -> None:
        """Make the index cover `seq`: append its new tokens, or rebuild when an earlier token changed
        (a jump-forward re-tokenizes the output's tail)."""
        k = len(self.tokens)
        if len(seq) < k or seq[:k] != self.tokens:
            self.tokens, self._next = [], {}
            k = 0
        for tok in seq[k:]:
            self._append(tok)

    def _append(self, tok: int) -> None:
        t = self.tokens
        end = len(t)  # the n-grams ending just before `tok` now have a continuation at `end`
        for n in range(self.min_n, min(self.max_n, end) + 1):
            self._next[tuple(t[end - n : end])] = end
        t.append(tok)

    def lookup(self, count: int, skip: int = 0) -> tuple[list[int], int]:
        """Up to `count` tokens that followed the latest earlier occurrence of the longest suffix
        (max_n down to min_n tokens) with one, and that suffix's length (0: no match, no tokens).

        `skip` continuation tokens are dropped first: with skip=1 the sequence is one token short of
        the request's (a sampled token still in flight) and the first continuation token is the
        guess for it. A continuation that runs into the suffix itself repeats with its period.
        """
        t = self.tokens
        end = len(t)
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            start = self._next.get(tuple(t[end - n : end]))
            if start is None:
                continue
            cont: list[int] = []
            period = end - start  # past the sequence's end the continuation repeats itself
            for j in range(skip + count):
                cont.append(t[start + j] if start + j < end else cont[j - period])
            return cont[skip:], n
        return [], 0
