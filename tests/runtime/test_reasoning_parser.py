"""The reasoning parser against a whole-text oracle (a regex), in any split of the reply."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.runtime.server.parsers import REASONING_FORMATS, Content, Reasoning, ReasoningParser


def run(name: str, phase: str, pieces: list[str]) -> tuple[str, str]:
    """(reasoning, content) of a reply fed in pieces."""
    p = ReasoningParser(REASONING_FORMATS[name], phase)
    events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
    assert all(e.text for e in events)
    return ("".join(e.text for e in events if isinstance(e, Reasoning)),
            "".join(e.text for e in events if isinstance(e, Content)))


def oracle(phase: str, implicit: bool, text: str) -> tuple[str, str]:
    m = re.match(r"\s*<think>", text)
    inside = phase == "open" or (phase == "maybe" and implicit)
    if phase == "closed" or (not m and not inside):
        return "", text
    body = text[m.end():] if m else text
    reasoning, sep, content = body.partition("</think>")
    return reasoning, content.lstrip(" \t\n\r") if sep else ""


REPLIES = ["<think>\nThe user asks for 2+2. </th> is not </think> yet.\n</think>\n\nIt is 4.",
           "  <think>short</think>answer", "no reasoning at all <think>x</think>", "<think>never ends",
           "reasoning without the tag</think>\n\ncontent", "<thi", "", "\n\n", "<think></think>"]


@pytest.mark.parametrize("name", list(REASONING_FORMATS))
@pytest.mark.parametrize("phase", ["open", "maybe", "closed"])
@pytest.mark.parametrize("text", REPLIES)
def test_every_split_matches_the_oracle(name, phase, text):
    want = oracle(phase, REASONING_FORMATS[name].implicit, text)
    assert run(name, phase, [text]) == want
    assert run(name, phase, list(text)) == want


PIECES = ["<think>", "</think>", "<", "</th", "a", " ", "\n", "ink>"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(REASONING_FORMATS)), st.sampled_from(["open", "maybe", "closed"]),
       st.lists(st.sampled_from(PIECES), max_size=10).map("".join), st.lists(st.integers(0, 40), max_size=6))
def test_random_replies_in_random_splits(name, phase, text, cuts):
    cuts = sorted({c for c in cuts if c < len(text)})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if b > a]
    assert run(name, phase, pieces) == oracle(phase, REASONING_FORMATS[name].implicit, text)


def test_phase_of_the_prompt():
    qwen, r1 = REASONING_FORMATS["qwen3"], REASONING_FORMATS["deepseek_r1"]
    assert qwen.phase_of("<|im_start|>assistant\n") == "maybe" and r1.phase_of("Assistant:") == "open"
    assert qwen.phase_of("assistant\n<think>\n") == "open"
    assert qwen.phase_of("assistant\n<think>\n\n</think>\n\n") == "closed"
