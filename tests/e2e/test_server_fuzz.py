"""Fuzzing a real `radixgen serve` (tiny random llama, SmolLM2 tokenizer, context 512) with bad input.

Every case is sent over HTTP as an attacker or a careless client would; each must get its 4xx with
an OpenAI-shaped error body (`{"error": {"message", "type", "param", "code"}}`, naming the field
where there is one) within a few seconds. Then a property test (hypothesis) sends request bodies
generated from the OpenAI request schema (our pydantic models' JSON schema) with random values and
random wrong types: each is answered 200 or 4xx, never 500, never a hang (a stream ends with
`[DONE]` or an error event). Afterwards a plain request gives the same greedy text as before the
fuzzing, and the KV pool is back to idle (a flush succeeds and leaves 0 tokens used).
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SERVER_ARGS = ("--context-length", "512", "--max-total-tokens", "4096", "--num-threads", "1",
               "--reject-unknown-fields")  # as the hosted API; the default ignores them (SGLang, vLLM)
PLAIN = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12, "temperature": 0}
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
FAST_S = 5.0  # "within a few seconds"


@pytest.fixture(scope="module")
def srv(start_server, tiny_models):
    s = start_server("--model", str(tiny_models["llama"]), *SERVER_ARGS)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def baseline(http) -> str:
    r = http.post(CHAT, json=PLAIN)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def post_raw(http, path: str, body: Any, timeout: float = 30) -> tuple[httpx.Response, float]:
    """POST `body` (bytes as they are, anything else as JSON text, surrogates escaped) and time it."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    t0 = time.perf_counter()
    r = http.post(path, content=data, headers={"content-type": "application/json"}, timeout=timeout)
    return r, time.perf_counter() - t0


def assert_openai_error(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err


def msg(content: Any, **extra: Any) -> dict:
    return {"messages": [{"role": "user", "content": content}], **extra}


def nested_schema(levels: int) -> str:
    """An object schema `levels` objects deep, as JSON text (too deep for json.dumps's recursion)."""
    return '{"type":"object","properties":{"a":' * levels + '{"type":"string"}' + "}}" * levels


def random_unicode(n: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        c = rng.randrange(0x110000)
        if not 0xD800 <= c <= 0xDFFF:
            out.append(chr(c))
    return "".join(out)


BIG = 50 * 1024 * 1024
DEEP = nested_schema(450)  # 901 levels of JSON nesting
# (case id, path, body, expected status, the param the error must name or None when there is none)
CASES: list[tuple[str, str, Any, int, str | None]] = [
    ("50MB body", COMPLETIONS, b'{"prompt": "' + b"a " * (BIG // 2) + b'"}', 413, None),
    ("n=10000", CHAT, msg("hi", n=10000), 400, "n"),
    ("n x prompts", COMPLETIONS, {"prompt": ["a"] * 64, "n": 4}, 400, "n"),
    ("900-deep schema", CHAT, ('{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":'
                               '"json_schema","json_schema":{"name":"x","schema":' + DEEP + "}}}").encode(), 400,
     "response_format.json_schema.schema"),
    ("deep json_schema text", COMPLETIONS, {"prompt": "a", "json_schema": DEEP}, 400, "json_schema"),
    ("huge schema", CHAT, msg("hi", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(9000)}}}}), 400,
     "response_format.json_schema.schema"),
    ("surrogate chat", CHAT, msg("a\ud800b"), 400, "messages.0.content"),
    ("surrogate completions", COMPLETIONS, {"prompt": "\udfff"}, 400, "prompt"),
    ("surrogate generate", "/generate", {"text": "x\udc00"}, 400, "text"),
    ("surrogate tokenize", "/tokenize", {"text": ["ok", "\ud83d"]}, 400, "text.1"),
    ("surrogate in a stop", CHAT, msg("hi", stop=["\ud800"]), 400, "stop.0"),
    ("surrogate in a schema", COMPLETIONS, {"prompt": "a", "json_schema": {"enum": ["\udead"]}}, 400,
     "json_schema.enum.0"),
    ("invalid UTF-8 in /generate text", "/generate", b'{"text": "caf\xc3("}', 400, None),
    ("invalid tool schema, tool_choice auto", CHAT, msg("hi", tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "nope"}}}], tool_choice="auto"), 400, "tools.0.function.parameters"),
    ("129 tools", CHAT, msg("hi", tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]),
     400, "tools"),
    ("100 stop strings", CHAT, msg("hi", stop=[f"s{i}" for i in range(100)]), 400, "stop"),
    ("a 10,000-character stop string", COMPLETIONS, {"prompt": "a", "stop": "x" * 10_000}, 400, "stop"),
    ("100 stops in /generate", "/generate", {"text": "a", "sampling_params": {"stop": ["x"] * 100}}, 400,
     "sampling_params.stop"),
    ("max_tokens=10**9", CHAT, msg("hi", max_tokens=10**9), 400, "max_tokens"),
    ("max_new_tokens=10**9", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 10**9}}, 400,
     "sampling_params.max_new_tokens"),
    ("n x max_tokens over the KV share", COMPLETIONS, {"prompt": "hi", "n": 8, "max_tokens": 400}, 400,
     "max_tokens"),
    ("malformed JSON", CHAT, b'{"messages": [', 400, None),
    ("not JSON at all", COMPLETIONS, b"\x00\x01garbage", 400, None),
    ("NaN", COMPLETIONS, b'{"prompt": "a", "temperature": NaN}', 400, None),
    ("JSON nested 100,000 deep", COMPLETIONS, b"[" * 100_000 + b"]" * 100_000, 400, None),
    ("body is a list", CHAT, [1, 2, 3], 400, None),
    ("messages is a string", CHAT, {"messages": "hi"}, 400, "messages"),
    ("no messages", CHAT, {"messages": []}, 400, "messages"),
    ("temperature is a word", COMPLETIONS, {"prompt": "a", "temperature": "hot"}, 400, "temperature"),
    ("n is a list", CHAT, msg("hi", n=[2]), 400, "n"),
    ("negative max_tokens", COMPLETIONS, {"prompt": "a", "max_tokens": -5}, 400, "max_tokens"),
    ("top_p 2", CHAT, msg("hi", top_p=2.0), 400, "top_p"),
    ("logit_bias keys are words", CHAT, msg("hi", logit_bias={"hello": 5}), 400, "logit_bias"),
    ("role unknown", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("image content part", CHAT, msg([{"type": "image_url", "image_url": {"url": "x"}}]), 400, "messages"),
    ("unknown field in /generate", "/generate", {"text": "hi", "frobnicate": 1}, 400, "frobnicate"),
    ("unknown field in chat", CHAT, msg("hi", frobnicate=1), 400, "frobnicate"),
    ("unknown field in completions", COMPLETIONS, {"prompt": "a", "max_tokens": 2, "best_of_all": 3}, 400,
     "best_of_all"),
    ("token id out of range", COMPLETIONS, {"prompt": [1, 2, 10**9]}, 400, "prompt"),
    ("negative token id in /generate", "/generate", {"input_ids": [1, -4]}, 400, "input_ids"),
    ("detokenize -1", "/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("detokenize 2**70", "/detokenize", {"tokens": [2**70]}, 400, None),
    ("invalid regex", COMPLETIONS, {"prompt": "a", "regex": "[a-"}, 400, "regex"),
    ("invalid EBNF", COMPLETIONS, {"prompt": "a", "ebnf": "root ::= undefined_rule"}, 400, "ebnf"),
    ("EBNF without root", "/generate", {"text": "a", "sampling_params": {"ebnf": "x ::= \"a\""}}, 400,
     "sampling_params"),
    ("schema text is not JSON", COMPLETIONS, {"prompt": "a", "json_schema": "{not json"}, 400, "json_schema"),
    ("unknown model", CHAT, msg("hi", model="gpt-9"), 404, "model"),
    ("20,000 random Unicode characters", COMPLETIONS, {"prompt": random_unicode(20_000)}, 400, "prompt"),
    ("20,000 random Unicode characters in chat", CHAT, msg(random_unicode(20_000, seed=8)), 400, "messages"),
    ("prompt over the context", "/generate", {"text": "word " * 600}, 400, "text"),
    ("top_logprobs 50", CHAT, msg("hi", logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    ("two constraints", COMPLETIONS, {"prompt": "a", "regex": "a", "ebnf": "root ::= \"a\""}, 400, "ebnf"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_fast_4xx(http, baseline, case):
    _, path, body, status, param = case
    r, took = post_raw(http, path, body)
    assert r.status_code == status, r.text[:500]
    err = assert_openai_error(r)
    assert took < FAST_S, f"answered in {took:.1f} s"
    if param is not None:
        assert err["param"] == param, err
    assert r.headers.get("x-request-id")


@pytest.mark.parametrize("pattern", ["(a+)+$", "(a|aa)*b", "(.*a){20}", "x{1,100000}", "(a|b)*a(a|b){20}",
                                     "(\\w+\\s?)*$"])
def test_catastrophic_regexes_are_served_quickly(http, baseline, pattern):
    """Patterns that make backtracking engines explode compile to automata here: served (200) or refused
    (4xx) within a few seconds, never a hang."""
    r, took = post_raw(http, COMPLETIONS, {"prompt": "a", "regex": pattern, "max_tokens": 6})
    assert took < FAST_S and (r.status_code == 200 or 400 <= r.status_code < 500), (took, r.text[:300])


def test_nul_characters_are_text(http, baseline):
    """NUL is a character the tokenizer takes (byte-level BPE): not an error."""
    r, _ = post_raw(http, "/generate", {"text": "a\x00b", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and r.json()["meta_info"]["prompt_tokens"] == 3


def test_a_pattern_no_token_can_spell_is_a_400_for_that_request(http, baseline):
    """U+40000 is UTF-8 F1 80 80 80; no SmolLM2 token starts with byte F1, so the constraint cannot be
    followed: the request gets a 400 naming that, not a 500, and the server goes on serving."""
    r, _ = post_raw(http, CHAT, msg("x", regex="\U00040000", max_tokens=4, temperature=0))
    assert r.status_code == 400, r.text
    assert assert_openai_error(r)["code"] == "constraint_unfollowable"
    r, _ = post_raw(http, CHAT, PLAIN)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == baseline


def test_max_tokens_up_to_the_room_pass_one_more_is_an_error(http, baseline):
    text = "word " * 500
    room = 512 - len(http.post("/tokenize", json={"text": text}).json()["tokens"])
    r, _ = post_raw(http, "/generate", {"text": text, "sampling_params": {"max_new_tokens": room}})
    assert r.status_code == 200, r.text
    r, _ = post_raw(http, "/generate", {"text": text, "sampling_params": {"max_new_tokens": room + 1}})
    assert r.status_code == 400 and assert_openai_error(r)["code"] == "context_length_exceeded"


# ---------------------------------------------------------------------------------------------- property test


def from_schema(schema: dict, defs: dict, depth: int = 0) -> st.SearchStrategy:
    """Values of the type a pydantic JSON schema describes (refs, anyOf, enums, objects, arrays, scalars);
    numbers mostly in the useful range, sometimes anywhere."""
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, depth)
    if "anyOf" in schema:
        return st.one_of(*(from_schema(s, defs, depth) for s in schema["anyOf"]))
    if "enum" in schema or "const" in schema:
        return st.sampled_from(schema.get("enum", [schema.get("const")]))
    kind = schema.get("type")
    if kind == "string":
        return st.text(st.characters(codec=None), max_size=24)
    if kind == "integer":
        return st.integers(0, 8) | st.integers(-2, 10**6) | st.integers()
    if kind == "number":
        return st.floats(0, 1) | st.floats(-3, 3) | st.floats(allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array" and depth < 4:
        lo = schema.get("minItems", 0)
        return st.lists(from_schema(schema.get("items", {}), defs, depth + 1), min_size=lo, max_size=max(lo, 3))
    if kind == "object" and "properties" in schema and depth < 4:
        props = {k: from_schema(v, defs, depth + 1) for k, v in schema["properties"].items()}
        required = {k: props[k] for k in schema.get("required", [])}
        return st.fixed_dictionaries(required, optional={k: v for k, v in props.items() if k not in required})
    return ANY_JSON


ANY_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) |
                        st.text(st.characters(codec=None), max_size=12),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                    max_size=3), max_leaves=6)
CHEAP = {"model": st.sampled_from([None, "default"]), "max_tokens": st.integers(-1, 16) | st.none(),
         "n": st.integers(0, 3), "max_completion_tokens": st.none() | st.integers(0, 16)}


@st.composite
def openai_body(draw: Any, model: type) -> dict:
    """A body of `model`'s schema: its required fields, up to four optional ones, and at times one field
    (maybe unknown) replaced by a random JSON value of any type."""
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    props = schema["properties"]
    optional = sorted(k for k in props if k not in schema.get("required", ()))
    keys = [*schema.get("required", ()), *draw(st.lists(st.sampled_from(optional), max_size=4, unique=True))]
    body = {k: draw(CHEAP[k] if k in CHEAP else from_schema(props[k], defs)) for k in keys}
    body.setdefault("max_tokens", draw(CHEAP["max_tokens"]))
    if draw(st.integers(0, 2)) == 0:
        body[draw(st.sampled_from([*props, "unknown_field"]))] = draw(ANY_JSON)
    return body


def request_bodies() -> st.SearchStrategy:
    from radixgen.runtime.server.protocol import ChatCompletionRequest, CompletionRequest

    return st.tuples(st.just(CHAT), openai_body(ChatCompletionRequest)) | \
        st.tuples(st.just(COMPLETIONS), openai_body(CompletionRequest))


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(request_bodies())
def test_random_openai_bodies_never_500_or_hang(srv, baseline, path_body):
    path, body = path_body
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        r, _ = post_raw(client, path, body, timeout=60)
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:500], body)
    if r.status_code != 200:
        assert_openai_error(r)
    elif r.headers["content-type"].startswith("text/event-stream"):
        events = [e for e in r.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]" or '"error"' in events[-1], events[-3:]


# ---------------------------------------------------------------------------------------------- afterwards


def test_afterwards_same_greedy_text_and_idle_kv(srv, http, baseline):
    r = http.post(CHAT, json=PLAIN)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == baseline
    deadline = time.monotonic() + 30
    while not http.post("/flush_cache").json()["success"]:  # false only while a request is in flight
        assert time.monotonic() < deadline, "a request is still in flight"
        time.sleep(0.2)
    stats = http.get("/stats").json()
    assert stats["kv_used"] == 0 and stats["running"] == 0 and stats["waiting"] == 0, stats
    assert "Traceback" not in srv.log.read_text()  # no request content reached the catch-all
