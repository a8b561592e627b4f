"""`JsonScanner` against `json.loads`: it accepts exactly the texts json.loads accepts (RFC 8259, no
NaN / Infinity), and its events mark where each value begins and ends."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.runtime.server.parsers.json_scan import ERROR, Begin, End, JsonScanner, Key


def scan(text: str) -> tuple[bool, list]:
    """(whether `text` is one complete JSON value, the events)."""
    sc, events = JsonScanner(), []
    for ch in text:
        events += sc.step(ch)
    if ERROR in events:
        return False, events
    if not sc.done:  # a root number ends with the text
        events += sc.step(" ")
    return sc.done and ERROR not in events, events


def loads_ok(text: str) -> bool:
    try:
        json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError:
        return False
    return True


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.sampled_from([None, 2]), st.booleans())
def test_accepts_what_json_dumps_writes(value, indent, ascii_only):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    ok, events = scan(" " + text + "\n")
    assert ok
    assert events[0] == Begin(0, text[0])
    ends = [e for e in events if isinstance(e, End) and e.depth == 0]
    assert len(ends) == 1 and (ends[0].text == value if isinstance(value, str) else ends[0].text is None)


ALPHABET = list('{}[]",:0123456789-+.eE \n\\/ubfnrtlsa') + ["true", "false", "null", "\\u00e9", "\x01"]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=14).map("".join))
def test_accepts_exactly_what_json_loads_accepts(text):
    assert scan(text)[0] == loads_ok(text)


@settings(max_examples=500, deadline=None)
@given(JSON_VALUES, st.integers(0, 10_000), st.sampled_from(["", "x", "}", ",", '"', "0", " "]))
def test_broken_values_are_rejected_like_json_loads(value, where, junk):
    text = json.dumps(value)
    i = where % (len(text) + 1)
    broken = text[:i] + junk + text[i + 1:]
    assert scan(broken)[0] == loads_ok(broken)


def test_events_locate_members():
    text = '{"name": "f", "arguments": {"a": [1, 2.5], "b": "x\\"y"}, "n": -3}'
    sc = JsonScanner()
    events = [(i, e) for i, ch in enumerate(text) for e in sc.step(ch)]  # (position, event)
    keys = [e.name for _, e in events if isinstance(e, Key) and e.depth == 1]
    assert keys == ["name", "arguments", "n"]
    begins = {i for i, e in events if isinstance(e, Begin) and e.depth == 1}
    ends = {i for i, e in events if isinstance(e, End) and e.depth == 1}
    args_at = text.index("{", 1)
    assert args_at in begins and text.index("}") in ends  # the arguments object, first to last char
    number_end = [i for i, e in events if isinstance(e, End) and e.depth == 1 and not e.at_char]
    assert number_end == [len(text) - 1]  # -3 ends when `}` arrives
    assert [e.text for _, e in events if isinstance(e, End) and e.depth == 2 and e.text] == ['x"y']
