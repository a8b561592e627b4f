"""StopRegex (radixgen/common/stop_regex.py) against Python's re on growing texts."""

from __future__ import annotations

import re

import pytest

from radixgen.common.stop_regex import StopRegex


def test_earliest_ending_match_among_patterns():
    stop = StopRegex([r"b+c", r"[0-9]"])
    assert stop.match("aaa") is None
    m = stop.match("xx 12 bbc")
    assert (m.end, m.pattern) == (4, "[0-9]")  # "1" ends before "bbc"
    text = "one two three 4 five"
    for end in range(len(text) + 1):  # fed a growing text, it fires exactly when re first finds a match
        found = stop.match(text[:end])
        ref = re.search(r"[0-9]", text[:end])
        assert (found is None) == (ref is None) and (found is None or found.end == ref.end())


def test_params():
    assert StopRegex.from_param(None) is None and StopRegex.from_param([]) is None and StopRegex.from_param(()) is None
    assert StopRegex.from_param("x").match("axb").end == 2
    with pytest.raises(ValueError, match="invalid stop_regex"):
        StopRegex.from_param(["(unclosed"])
    with pytest.raises(ValueError, match="non-empty"):
        StopRegex.from_param([""])
