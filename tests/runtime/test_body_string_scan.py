"""The pre-parse scan for over-long strings in request bodies (server/body_checks.py), checked against
json.dumps' own rendering of every string and key of random documents."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.runtime.server.body_checks import longest_string_bytes, parse_body
from radixgen.runtime.server.protocol import APIError

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)) | st.sampled_from('"\\\n\t/'), max_size=40)
documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(texts, inner, max_size=5),
    max_leaves=30,
)


def literal_bytes(doc, ensure_ascii: bool) -> int:
    """The oracle: bytes between the quotes of the longest string or key as json.dumps renders it."""
    if isinstance(doc, str):
        return len(json.dumps(doc, ensure_ascii=ensure_ascii).encode()) - 2
    if isinstance(doc, list):
        return max((literal_bytes(x, ensure_ascii) for x in doc), default=0)
    if isinstance(doc, dict):
        return max((max(literal_bytes(k, ensure_ascii), literal_bytes(v, ensure_ascii)) for k, v in doc.items()),
                   default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(documents, st.booleans())
def test_longest_string_matches_json_dumps(doc, ensure_ascii):
    raw = json.dumps(doc, ensure_ascii=ensure_ascii).encode()
    assert longest_string_bytes(raw, len(raw)) == literal_bytes(doc, ensure_ascii)


def test_escaped_backslashes_before_a_quote():
    # "a\\" ends at its third quote (the backslash is escaped); "b\"c" holds an escaped quote
    raw = json.dumps({"k": "a\\", "m": 'b"c' * 10}).encode()
    assert longest_string_bytes(raw, len(raw)) == len(json.dumps('b"c' * 10)) - 2


def test_a_huge_string_is_refused_before_it_is_parsed():
    raw = b'{"messages": [{"role": "user", "content": "' + b"a " * 500_000 + b'"}], "model": "m"}'
    with pytest.raises(APIError) as e:
        parse_body(raw, max_string_bytes=10_000)
    assert e.value.status == 400 and e.value.body()["error"]["code"] == "context_length_exceeded"
    assert "a string of 1000000 bytes" in str(e.value.body()["error"]["message"])
    assert parse_body(raw, max_string_bytes=1_000_000)["model"] == "m"  # within the bound: parsed as usual
