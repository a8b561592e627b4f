"""NgramIndex (prompt-lookup drafts) against a naive scan of the sequence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.runtime.speculative.ngram import NgramIndex


def naive_lookup(t: list[int], min_n: int, max_n: int, count: int, skip: int) -> tuple[list[int], int]:
    """Longest suffix (max_n .. min_n tokens) with an earlier occurrence; the tokens after its latest
    one, the virtual sequence extended by copying itself when the continuation reaches the end."""
    end = len(t)
    for n in range(min(max_n, end), min_n - 1, -1):
        starts = [s for s in range(n, end) if t[s - n : s] == t[end - n :]]
        if starts:
            s = max(starts)
            virtual = list(t)
            while len(virtual) < s + skip + count:
                virtual.append(virtual[len(virtual) - (end - s)])
            return virtual[s + skip : s + skip + count], n
    return [], 0


@given(seqs=st.lists(st.lists(st.integers(0, 4), max_size=40), min_size=1, max_size=4),
       min_n=st.integers(1, 3), extra=st.integers(0, 3), count=st.integers(1, 6), skip=st.integers(0, 1))
@settings(max_examples=300, deadline=None)
def test_lookup_equals_naive_scan(seqs, min_n, extra, count, skip):
    """Successive syncs (appends, and edits of earlier tokens: a rebuild) keep lookups exact."""
    index = NgramIndex(min_n, min_n + extra)
    for seq in seqs:
        index.sync(seq)
        assert index.lookup(count, skip) == naive_lookup(seq, min_n, min_n + extra, count, skip)


def test_prompt_copy():
    doc = [5, 6, 7, 8, 9, 10, 11]
    index = NgramIndex(1, 4)
    index.sync([1, 2, *doc, 3, 4, 6, 7])
    assert index.lookup(3) == ([8, 9, 10], 2)  # "6 7" continued as in the document
    assert index.lookup(3, skip=1) == ([9, 10, 11], 2)  # one token in flight, guessed to be 8
    index.sync([1, 2, *doc, 3, 4, 6, 7, 8, 9])
    assert index.lookup(2) == ([10, 11], 4)


def test_bad_window():
    with pytest.raises(ValueError, match="min <= max"):
        NgramIndex(3, 2)
