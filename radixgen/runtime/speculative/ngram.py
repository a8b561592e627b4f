"""Prompt-lookup drafts: continue the sequence the way it continued after the last earlier
occurrence of its longest recent suffix (prompt lookup decoding; vLLM's n-gram proposer and
llama.cpp's `LlamaPromptLookupDecoding` propose the same way).

`NgramIndex` keeps a request's tokens in a numpy buffer and scans it at each lookup: the positions
holding the sequence's last token, narrowed by one vectorized comparison per further suffix token
(at most max_n of them). A scan of a few thousand tokens takes microseconds, where indexing every
n-gram of min_n..max_n at each position cost a dictionary insert per length per token: ~40 ms for a
~1,300-token prompt, on the scheduler's thread, in the step that admits it.
"""

from __future__ import annotations

import numpy as np


class NgramIndex:
    """The suffix matches of one growing token sequence (the request's prompt + output)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram match lengths must satisfy 1 <= min <= max, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._buf = np.empty(0, dtype=np.int64)  # [capacity]: tokens in its first len(tokens) slots

    def sync(self, seq: list[int]) -> None:
        """Make the index cover `seq`: append its new tokens, or start over when an earlier token changed
        (a jump-forward re-tokenizes the output's tail)."""
        k = len(self.tokens)
        if len(seq) < k or seq[:k] != self.tokens:
            self.tokens, k = [], 0
        if len(seq) == k:
            return
        self.tokens.extend(seq[k:])
        end = len(self.tokens)
        if end > len(self._buf):  # grow by doubling: appends cost O(1) each on average
            grown = np.empty(max(end, 2 * len(self._buf), 64), dtype=np.int64)
            grown[:k] = self._buf[:k]
            self._buf = grown
        self._buf[k:end] = seq[k:]

    def lookup(self, count: int, skip: int = 0) -> tuple[list[int], int]:
        """Up to `count` tokens that followed the latest earlier occurrence of the longest suffix
        (max_n down to min_n tokens) with one, and that suffix's length (0: no match, no tokens).

        `skip` continuation tokens are dropped first: with skip=1 the sequence is one token short of
        the request's (a sampled token still in flight) and the first continuation token is the
        guess for it. A continuation that runs into the suffix itself repeats with its period.
        """
        t, end = self.tokens, len(self.tokens)
        if end < 2:
            return [], 0
        a = self._buf[:end]
        ends = np.flatnonzero(a[: end - 1] == a[end - 1])  # earlier occurrences' last positions (ascending)
        n = 1
        while ends.size and n < min(self.max_n, end - 1):  # one more suffix token matched by each survivor
            more = ends[ends >= n]
            more = more[a[more - n] == a[end - 1 - n]]
            if not more.size:
                break
            ends, n = more, n + 1
        if not ends.size or n < self.min_n:
            return [], 0
        start = int(ends[-1]) + 1  # the latest occurrence's continuation
        period = end - start  # past the sequence's end the continuation repeats itself
        cont: list[int] = []
        for j in range(skip + count):
            cont.append(t[start + j] if start + j < end else cont[j - period])
        return cont[skip:], n
