"""The mistral, pythonic and qwen3_coder tool-call parsers against whole-text oracles (regexes and
`json.loads` for Mistral, Python's own `ast` for pythonic calls, regexes and the schema's types for
Qwen3-Coder XML), as test_tool_call_parsers.py checks the JSON-object formats.

Replies as the model cards and chat templates write them are split at SmolLM2 token boundaries in
every way hypothesis draws: each split must give the oracle's calls, and what streamed must fold into
the same message. Truncated, mutated and unknown-name replies never raise; a reply left without calls
is its own text as content.
"""

from __future__ import annotations

import ast
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgen.runtime.server.parsers import TOOL_FORMATS, detect_format
from tests.runtime.test_tool_call_parsers import fold, split

FUNCTIONS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"},
                                                     "days": {"type": "integer"}}},
    "get_time": {"type": "object", "properties": {"tz": {"type": "string"}, "fmt": {"type": "object"},
                                                  "note": {"type": "string"}}},
}

RECORDED = {
    "mistral": [
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
        '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}',
        'Let me check.[TOOL_CALLS]get_time[ARGS]{"tz": "say \\"hi\\" [ARGS] \\u00e9"}',
    ],
    "pythonic": [
        '[get_weather(city="San Francisco", unit="celsius"), get_time(tz=\'Asia/Tokyo\')]',
        '<|python_start|>[get_time(tz="UTC", fmt={"24h": True, "digits": [1, 2.5e3, -0.5]}, note=None), '
        'get_weather(city="a, (b)]", days=3)]<|python_end|>',
        "[get_time()]",
    ],
    "qwen3_coder": [
        "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
        "<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_time>\n<parameter=note>\nline one\n<b>two</b> </param\n</parameter>\n"
        '<parameter=fmt>\n{"24h": true}\n</parameter>\n</function>\n</tool_call>',
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
    ],
}
CASES = [(fmt, text) for fmt, texts in RECORDED.items() for text in texts]


def oracle(fmt: str, text: str) -> tuple[str, list[tuple[str, dict]]]:
    """(content, calls) of a whole reply, parsed by other means than the incremental parsers."""
    if fmt == "mistral":
        head, _, rest = text.partition("[TOOL_CALLS]")
        if rest.startswith(" ["):
            return head, [(o["name"], o["arguments"]) for o in json.loads(rest)]
        calls = re.findall(r"(\w+)\[ARGS\](.*?)(?=\[TOOL_CALLS\]|$)", rest)
        return head, [(n, json.loads(a)) for n, a in calls]
    if fmt == "pythonic":
        tree = ast.parse(text.removeprefix("<|python_start|>").removesuffix("<|python_end|>"), mode="eval")
        return "", [(c.func.id, {k.arg: ast.literal_eval(k.value) for k in c.keywords}) for c in tree.body.elts]
    head = text.split("<tool_call>")[0].strip()
    calls = []
    for name, body in re.findall(r"<function=(\w+)>(.*?)</function>", text, re.S):
        args = {}
        for key, raw in re.findall(r"<parameter=(\w+)>\s*(.*?)\s*</parameter>", body, re.S):
            kind = FUNCTIONS[name]["properties"][key]["type"]
            args[key] = raw if kind == "string" else int(raw) if kind == "integer" else json.loads(raw)
        calls.append((name, args))
    return head, calls


def run(fmt: str, pieces: list[str], names=tuple(FUNCTIONS), max_calls: int | None = None) -> list:
    fmt_ = TOOL_FORMATS[fmt]
    parser = fmt_.parser({n: FUNCTIONS.get(n) for n in names}, max_calls)
    events = [e for p in pieces for e in parser.feed(p)]
    return events + parser.finish()


def parsed(events: list) -> tuple[str, list[tuple[str, dict]]]:
    content, calls = fold(events)
    return content, [(n, json.loads(a)) for n, a in calls]


@pytest.fixture(scope="module")
def token_ends():
    from radixgen.runtime.tokenizer import load_tokenizer

    hf = load_tokenizer().hf

    def ends(text: str) -> list[int]:
        offsets = hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return sorted({e for _, e in offsets if 0 < e < len(text)})

    return ends


@pytest.mark.parametrize(("fmt", "text"), CASES)
def test_recorded_replies_give_the_oracles_calls_in_any_token_split(fmt, text, token_ends):
    whole = fold(run(fmt, [text]))
    assert parsed(run(fmt, [text])) == oracle(fmt, text)
    ends = token_ends(text)
    assert fold(run(fmt, split(text, ends))) == whole
    assert fold(run(fmt, list(text))) == whole

    @settings(max_examples=25, deadline=None)
    @given(st.sets(st.sampled_from(ends)))
    def any_token_split(cuts):
        assert fold(run(fmt, split(text, cuts))) == whole

    any_token_split()


@pytest.mark.parametrize(("fmt", "text"), CASES)
def test_arguments_stream_before_the_call_ends(fmt, text, token_ends):
    events = run(fmt, split(text, token_ends(text)))
    names = [e.name for e in events if type(e).__name__ == "CallStart"]
    assert names == [n for n, _ in oracle(fmt, text)[1]]
    calls_with_args = [a for _, a in oracle(fmt, text)[1] if len(a) > 1]
    if calls_with_args:  # several arguments (or tokens of one): several fragments
        assert sum(type(e).__name__ == "CallArgs" for e in events) > len(names)


@pytest.mark.parametrize(("fmt", "text"), CASES)
def test_truncated_replies_never_raise_and_keep_only_complete_calls(fmt, text):
    want = oracle(fmt, text)[1]
    for cut in range(len(text)):
        content, calls = parsed(run(fmt, [text[:cut]]))
        assert calls == want[:len(calls)]
        if not calls:  # no call: the reply is content, exactly
            assert content == text[:cut]


@pytest.mark.parametrize(("fmt", "text"), CASES)
def test_unknown_tool_names_are_content(fmt, text):
    assert fold(run(fmt, [text], names=("other",))) == (text, [])
    assert fold(run(fmt, list(text), names=("other",))) == (text, [])


@pytest.mark.parametrize("fmt", list(RECORDED))
def test_malformed_calls_are_content(fmt):
    good = TOOL_FORMATS[fmt].render_calls([("get_weather", {"city": "Rome"})])
    assert parsed(run(fmt, [good])) == ("", [("get_weather", {"city": "Rome"})])
    broken = {"mistral": ['[TOOL_CALLS]get_weather[ARG]{"city": "Rome"}', '[TOOL_CALLS]get_weather[ARGS]["Rome"]',
                          '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome",}}]'],
              "pythonic": ['[get_weather(city="Rome",,)]', '[get_weather(city=Rome)]', '[get_weather("Rome")]',
                           '[get_weather(city={1, 2})]', 'Sure: [get_weather(city="Rome")]', "[]"],
              "qwen3_coder": ["<tool_call>\n<function=get_weather>\n<param=city>\nRome\n</parameter>\n</function>",
                              "<tool_call>\n<function=get_weather\n</function>\n</tool_call>"]}[fmt]
    for text in broken:
        assert fold(run(fmt, [text])) == (text, []), text
        assert fold(run(fmt, list(text))) == (text, []), text
    for plain in ["", "hello", "[1, 2]", "<tool_call></tool_call>", "[TOOL_CALLS]", "<|python_start|>"]:
        assert fold(run(fmt, [plain])) == (plain, [])


def test_parallel_tool_calls_false_keeps_the_first():
    for fmt, texts in RECORDED.items():
        content, calls = parsed(run(fmt, [texts[0]], max_calls=1))
        assert [n for n, _ in calls] == [oracle(fmt, texts[0])[1][0][0]]


def test_format_round_trip_and_detection():
    calls = [("get_weather", {"city": "Oslo", "days": 2}), ("get_time", {"tz": "CET", "fmt": {"a": [True, None]}})]
    for fmt in RECORDED:
        text = TOOL_FORMATS[fmt].render_calls(calls)
        assert parsed(run(fmt, [text])) == ("", calls)
        assert oracle(fmt, text) == ("", calls)
    compact = TOOL_FORMATS["mistral"].for_template("{{ '[TOOL_CALLS]' + name + '[ARGS]' }}")
    assert compact.render_calls(calls[:1]) == '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 2}'
    assert detect_format("{{ '[TOOL_CALLS] [' }}").name == "mistral"
    assert detect_format("{% if tools %}<tool_call>\n<function={{ n }}>\n<parameter={{ p }}>{% endif %}"
                         ).name == "qwen3_coder"
    assert detect_format("[func_name1(params_name1=params_value1)]").name == "pythonic"


ALPHABET = list('[](){}",:=\n \'') + ["[TOOL_CALLS]", "[ARGS]", "<tool_call>", "</tool_call>", "<function=",
                                       "</function>", "<parameter=", "</parameter>", "get_weather", "True", "1"]


@settings(max_examples=200, deadline=None)
@given(base=st.sampled_from(CASES),
       edits=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["del", "ins"]), st.sampled_from(ALPHABET)),
                      max_size=4),
       cuts=st.lists(st.floats(0, 1), max_size=8))
def test_mutated_replies_never_raise_and_fold_alike_in_any_split(base, edits, cuts):
    fmt, text = base
    for where, op, piece in edits:
        i = int(where * len(text))
        text = text[:i] + text[i + 1:] if op == "del" else text[:i] + piece + text[i:]
    whole = fold(run(fmt, [text]))
    assert fold(run(fmt, split(text, [int(c * len(text)) for c in cuts]))) == whole
    content, calls = whole
    for name, args in calls:
        assert name in FUNCTIONS and isinstance(json.loads(args), dict)
    if not calls:
        assert content == text
