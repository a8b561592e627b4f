"""The incremental tool-call parsers against a whole-text oracle (regexes + `json.loads`), per format.

Recorded replies are split at token boundaries (the SmolLM2 tokenizer) in every way hypothesis
draws: each split must give the oracle's calls, and what streamed must fold into the same message.
Malformed calls (unterminated JSON, unknown tool names, broken syntax) must come out as plain content,
never as an exception; mutated replies must keep those promises too.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.runtime.server.parsers import (
    TOOL_FORMATS,
    CallArgs,
    CallRevoked,
    CallStart,
    Content,
    ToolCallParser,
    detect_format,
)

NAMES = ("get_weather", "get_time")

# SmolLM2-135M-Instruct's replies, recorded from `radixgen serve` (tool_choice required; the first
# with a grammar that put the arguments before the name), and replies in the Hermes / Qwen2.5 and
# Llama 3.1 formats as their model cards write them.
RECORDED = {
    "smollm2": [
        '<tool_call>[{"name": "get_weather", "arguments": { "city" : "Paris", "unit" : "celsius" }}]</tool_call>',
        '<tool_call>[{"arguments" : {"city" : "Paris", "unit" : "celsius"}, "name" : "get_weather"}, '
        '{"arguments" : {"city" : "Tokyo", "unit" : "fahrenheit"}, "name" : "get_weather"}]</tool_call>',
        '[{"name": "get_time", "arguments": {"tz": "Asia/Tokyo"}}]',
    ],
    "hermes": [
        'I will look both up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n'
        '</tool_call>',
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC", "fmt": {"24h": true, "digits": [1, 2.5e3, '
        '-0.5]}, "note": "say \\"hi\\" \\u00e9 <tool_call>"}}\n</tool_call>',
    ],
    "llama3_json": [
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
        '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}',
        '<|python_tag|>{"name": "get_time", "parameters": {}}',
    ],
}


# ---------------------------------------------------------------------------------------------- oracle


def oracle(fmt: str, text: str, names=NAMES) -> list[tuple[str, dict]] | None:
    """The calls in a whole reply, by regexes and json.loads; None when it is not all calls."""
    if fmt == "hermes":
        bodies = re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S)
        objs = [json.loads(b) for b in bodies]
    elif fmt == "llama3_json":
        objs = [json.loads(part) for part in text.removeprefix("<|python_tag|>").split("; ")]
    else:
        m = re.fullmatch(r"\s*(?:<tool_call>)?(\[.*\])(?:</tool_call>)?\s*", text, re.S)
        objs = json.loads(m[1]) if m else None
    if not objs or any(o["name"] not in names for o in objs):
        return None
    return [(o["name"], o.get("arguments", o.get("parameters"))) for o in objs]


JSON_FORMATS = list(RECORDED)  # the formats of JSON call objects (the others: test_tool_call_parsers_more.py)


def run(fmt: str, pieces: list[str], names=NAMES, max_calls: int | None = None) -> list:
    parser = ToolCallParser(TOOL_FORMATS[fmt], names, max_calls)
    events = [e for p in pieces for e in parser.feed(p)]
    return events + parser.finish()


def fold(events: list) -> tuple[str, list[tuple[str, str]]]:
    """(content, [(name, arguments text)]) as a non-streamed message would hold them."""
    content = "".join(e.text for e in events if isinstance(e, Content))
    revoked = {e.index for e in events if isinstance(e, CallRevoked)}
    calls: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls) and e.id.startswith("call_")
            calls[e.index] = [e.name, ""]
        elif isinstance(e, CallArgs):
            calls[e.index][1] += e.text  # fragments only after their call's start
    return content, [(n, a) for i, (n, a) in sorted(calls.items()) if i not in revoked]


@pytest.fixture(scope="module")
def token_ends():
    """A function: text -> the character offsets where its SmolLM2 tokens end."""
    from radixgen.runtime.tokenizer import load_tokenizer

    hf = load_tokenizer().hf

    def ends(text: str) -> list[int]:
        offsets = hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return sorted({e for _, e in offsets if 0 < e < len(text)})

    return ends


def split(text: str, cuts) -> list[str]:
    cuts = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


CASES = [(fmt, text) for fmt, texts in RECORDED.items() for text in texts]


@pytest.mark.parametrize(("fmt", "text"), CASES)
def test_recorded_replies_give_the_oracles_calls_in_any_token_split(fmt, text, token_ends):
    want = oracle(fmt, text)
    assert want is not None
    whole = fold(run(fmt, [text]))
    assert [(n, json.loads(a)) for n, a in whole[1]] == want
    assert all(a in text for _, a in whole[1])  # the arguments are the reply's own text, as generated
    assert whole[0] in ("", "I will look both up.")  # text before the calls stays content
    ends = token_ends(text)
    assert fold(run(fmt, split(text, ends))) == whole  # one token at a time
    assert fold(run(fmt, list(text))) == whole  # one character at a time

    @settings(max_examples=40, deadline=None)
    @given(st.sets(st.sampled_from(ends)))
    def any_token_split(cuts):
        assert fold(run(fmt, split(text, cuts))) == whole

    any_token_split()


@pytest.mark.parametrize(("fmt", "text"), CASES)
def test_calls_stream_their_arguments_as_generated(fmt, text, token_ends):
    events = run(fmt, split(text, token_ends(text)))
    starts = [i for i, e in enumerate(events) if isinstance(e, CallStart)]
    for k, at in enumerate(starts):  # the start names the call; its arguments come after it
        frags = [e for e in events if isinstance(e, CallArgs) and e.index == k]
        assert frags and events.index(frags[0]) > at
    name_first = '"arguments" : {' not in text.split('"name"')[0]
    if name_first and any(len(a) > 2 for _, a in fold(events)[1]):  # several tokens: several fragments
        assert sum(isinstance(e, CallArgs) for e in events) > len(starts)


@pytest.mark.parametrize(("fmt", "text"), CASES)
def test_truncated_replies_never_raise_and_keep_only_complete_calls(fmt, text):
    want = oracle(fmt, text)
    for cut in range(len(text)):
        content, calls = fold(run(fmt, [text[:cut]]))
        assert [c for c, _ in calls] == [n for n, _ in want[:len(calls)]]
        for (_, args), (_, args_want) in zip(calls, want, strict=False):
            assert json.loads(args) == args_want  # a call still open at the end is not kept
        if not calls:
            assert content == text[:cut]  # malformed (unterminated): the reply as content, exactly


@pytest.mark.parametrize(("fmt", "text"), CASES)
def test_unknown_tool_names_are_content(fmt, text):
    assert fold(run(fmt, [text], names=("other",))) == (text, [])
    assert fold(run(fmt, list(text), names=("other",))) == (text, [])


@pytest.mark.parametrize("fmt", JSON_FORMATS)
def test_malformed_calls_are_content(fmt):
    f = TOOL_FORMATS[fmt]
    good = f.render_calls([("get_weather", {"city": "Rome"})])
    assert fold(run(fmt, [good])) == ("", [("get_weather", '{"city": "Rome"}')])
    broken = [good.replace("Rome\"}", "Rome\",}"),  # a syntax error after the call started
              good.replace('"get_weather"', "get_weather"), good.replace("{", "{{", 1),
              good.replace('{"city": "Rome"}', '"city"'),  # arguments that are not an object
              good.replace('"name"', '"function"')]
    for text in broken:
        assert fold(run(fmt, [text])) == (text, []), text
        assert fold(run(fmt, list(text))) == (text, []), text
    for plain in ["", "  \n", "hello", '{"city": "Rome"} is JSON', "[1, 2]", "<tool_call></tool_call>", "<tool"]:
        assert fold(run(fmt, [plain])) == (plain, [])


def test_parallel_tool_calls_false_keeps_the_first():
    (text,) = [t for t in RECORDED["llama3_json"] if "; " in t]
    content, calls = fold(run("llama3_json", [text], max_calls=1))
    assert content == "" and [n for n, _ in calls] == ["get_weather"]


def test_format_round_trip_and_detection():
    for fmt in JSON_FORMATS:
        f = TOOL_FORMATS[fmt]
        calls = [("get_weather", {"city": "Oslo"}), ("get_time", {"tz": "CET"})]
        text = f.render_calls(calls)
        assert oracle(fmt, text) == calls
        assert [(n, json.loads(a)) for n, a in fold(run(fmt, [text]))[1]] == calls
    assert detect_format("{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert detect_format("<|python_tag|>{{ x }}").name == "llama3_json"
    assert detect_format(None).name == "smollm2"


ALPHABET = list('{}[]",: \n') + ["<tool_call>", "</tool_call>", "<|python_tag|>", '"name"', '"arguments"',
                                  '"get_weather"', "1", "true", "x", "; "]


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from(JSON_FORMATS), base=st.sampled_from([t for _, t in CASES]),
       edits=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["del", "ins"]), st.sampled_from(ALPHABET)),
                      max_size=4),
       cuts=st.lists(st.floats(0, 1), max_size=8))
def test_mutated_replies_never_raise_and_fold_alike_in_any_split(fmt, base, edits, cuts):
    text = base
    for where, op, piece in edits:
        i = int(where * len(text))
        text = text[:i] + text[i + 1:] if op == "del" else text[:i] + piece + text[i:]
    whole = fold(run(fmt, [text]))
    assert fold(run(fmt, split(text, [int(c * len(text)) for c in cuts]))) == whole
    content, calls = whole
    for name, args in calls:
        assert name in NAMES and isinstance(json.loads(args), dict)
    if not calls:
        assert content == text
