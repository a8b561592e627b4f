"""Cheap server checks: the API key on a real `radixgen serve --api-key` (a tiny random model), and the
app's error paths, SSE framing, tool calls and metrics driven in process over raw ASGI (no sockets) on a
real Engine over a tiny random-weight llama with the SmolLM2 tokenizer. Output a random model cannot be
relied on to produce is forced with a grammar constraint (`regex`, or a named / required tool choice);
the tool-call parser is also checked as a pure function on literal strings."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from radixgen.runtime.engine import Engine
from radixgen.runtime.server import create_app
from radixgen.runtime.server.chat import build_messages, parse_tool_calls, render, tool_mode, tool_schema
from radixgen.runtime.server.protocol import ChatCompletionRequest

CTX = 512  # the tiny engine's context length (prompts over it are rejected)


def tiny_engine_of(tiny_models) -> Engine:
    return Engine(model=str(tiny_models["llama"]), context_length=CTX, max_total_tokens=4096)


@pytest.fixture(scope="module")
def tiny_engine(tiny_models):
    eng = tiny_engine_of(tiny_models)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def app(tiny_engine):
    return create_app(tiny_engine, model_name="tiny")


def call(app, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    """One HTTP request through the ASGI app; returns (status, body bytes)."""

    async def run() -> tuple[int, bytes]:
        incoming = [{"type": "http.request", "body": json.dumps(body).encode() if body is not None else b"",
                     "more_body": False}]
        sent: list[dict] = []

        async def receive() -> dict:
            if incoming:
                return incoming.pop(0)
            await asyncio.sleep(3600)  # the client never disconnects
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        hdrs = [(b"content-type", b"application/json")]
        hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": hdrs, "client": ("127.0.0.1", 1234), "server": ("127.0.0.1", 80)}
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    return asyncio.run(run())


def error_of(status_body: tuple[int, bytes], status: int) -> dict:
    got, raw = status_body
    assert got == status, raw
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def sse_events(raw: bytes) -> tuple[list[dict], str]:
    """(JSON chunks, last event) of an SSE body, checking every event is one `data: ` line."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-200:]
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    payloads = [e.removeprefix("data: ") for e in events]
    return [json.loads(p) for p in payloads[:-1]], payloads[-1]


def chat(app, body: dict) -> dict:
    """A non-streaming chat completion that must succeed."""
    status, raw = call(app, "POST", "/v1/chat/completions", body)
    assert status == 200, raw
    return json.loads(raw)


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 20, "temperature": 0}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}}
NAMED = dict(CHAT, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
             max_tokens=100)
ROME_CALL = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
ROME_REGEX = ROME_CALL.replace("{", r"\{").replace("}", r"\}")  # a regex matching exactly that text


def prompt_ids(engine: Engine, messages: list[dict]) -> list[int]:
    """The chat prompt the server should build: the model's template, tokenized without extra specials."""
    text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return engine.tokenizer.encode(text, add_special_tokens=False)


# ---------------------------------------------------------------------------------------------- auth / 503


def test_api_key_gate(tiny_engine):
    keyed = create_app(tiny_engine, api_key="sekrit", model_name="tiny")
    assert error_of(call(keyed, "GET", "/v1/models"), 401)["code"] == "invalid_api_key"
    error_of(call(keyed, "POST", "/v1/chat/completions", CHAT, {"Authorization": "Bearer wrong"}), 401)
    short = dict(CHAT, max_tokens=2)
    assert call(keyed, "POST", "/v1/chat/completions", short, {"Authorization": "Bearer sekrit"})[0] == 200
    assert call(keyed, "GET", "/v1/models", headers={"X-API-Key": "sekrit"})[0] == 200
    assert call(keyed, "GET", "/health")[0] == 200  # open for load balancers


def test_a_bug_is_a_logged_500_naming_the_request_id(tiny_engine, caplog):
    """No hung connection and no bare 'Internal Server Error' when a handler has a bug: a 500 in OpenAI's
    shape naming the request id (also logged with the traceback); a stream that breaks ends cleanly with
    an error event."""
    from radixgen.runtime.server.app import SSEResponse

    app = create_app(tiny_engine, model_name="tiny")

    @app.get("/bug")
    async def bug() -> None:
        raise RuntimeError("a bug in a handler")

    @app.get("/bug-mid-stream")
    async def bug_mid_stream() -> SSEResponse:
        async def events():
            yield b"data: {}\n\n"
            raise RuntimeError("a bug mid-stream")
        return SSEResponse(events())

    err = error_of(call(app, "GET", "/bug", headers={"X-Request-Id": "req-42"}), 500)
    assert "req-42" in err["message"] and err["type"] == "server_error" and err["code"] == "internal_error"
    assert any("req-42" in r.getMessage() and r.exc_info for r in caplog.records)
    status, raw = call(app, "GET", "/bug-mid-stream")
    events, last = sse_events(raw)
    assert status == 200 and events[0] == {} and json.loads(last)["error"]["code"] == "internal_error"


def test_503_when_draining_and_after_engine_shutdown(tiny_models):
    eng = tiny_engine_of(tiny_models)
    try:
        app = create_app(eng, model_name="tiny")
        short = dict(CHAT, max_tokens=2)
        assert call(app, "POST", "/v1/chat/completions", short)[0] == 200
        state = app.state.radixgen
        state.draining = True  # what `radixgen serve` does on SIGTERM (cli.py's handle_exit)
        assert error_of(call(app, "POST", "/v1/chat/completions", short), 503)["code"] == "shutting_down"
        assert error_of(call(app, "GET", "/health"), 503)["code"] == "shutting_down"
        assert error_of(call(app, "GET", "/v1/models"), 503)["code"] == "shutting_down"
        state.draining = False
        assert call(app, "POST", "/v1/chat/completions", short)[0] == 200
        eng.shutdown()  # the engine closed under a serving app: its calls are 503s too
        for path, body in [("/v1/chat/completions", short), ("/v1/chat/completions", dict(short, stream=True)),
                           ("/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 2}),
                           ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2}})]:
            assert error_of(call(app, "POST", path, body), 503)["code"] == "shutting_down", path
    finally:
        eng.shutdown()


# ---------------------------------------------------------------------------------------------- errors


def test_error_shapes(app, tiny_engine):
    assert error_of(call(app, "POST", "/v1/chat/completions", {"model": "tiny"}), 400)["param"] == "messages"
    assert error_of(call(app, "POST", "/v1/chat/completions", dict(CHAT, temperature=-1)), 400)["param"] == \
        "temperature"
    assert error_of(call(app, "POST", "/v1/chat/completions", dict(CHAT, model="x")), 404)["code"] == \
        "model_not_found"
    assert error_of(call(app, "GET", "/nope"), 404)["code"] == "not_found"
    too_long = "hello " * (CTX + 10)
    assert len(tiny_engine.tokenizer.encode(too_long, add_special_tokens=False)) > CTX
    long = dict(CHAT, messages=[{"role": "user", "content": too_long}])
    assert error_of(call(app, "POST", "/v1/chat/completions", long), 400)["code"] == "context_length_exceeded"
    assert error_of(call(app, "POST", "/v1/completions", {"model": "tiny", "prompt": too_long}), 400)["code"] == \
        "context_length_exceeded"
    bad = dict(CHAT, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}})
    assert error_of(call(app, "POST", "/v1/chat/completions", bad), 400)["param"] == "response_format"
    both = dict(CHAT, response_format={"type": "json_object"}, regex="a+")
    error_of(call(app, "POST", "/v1/chat/completions", both), 400)
    image = dict(CHAT, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert error_of(call(app, "POST", "/v1/chat/completions", image), 400)["param"] == "messages"
    assert error_of(call(app, "POST", "/v1/completions", {"model": "tiny", "prompt": "a", "suffix": "b"}), 400)[
        "param"] == "suffix"
    assert error_of(call(app, "POST", "/v1/chat/completions", dict(CHAT, tool_choice="required")), 400)[
        "param"] == "tool_choice"  # a tool choice without tools


# ---------------------------------------------------------------------------------------------- SSE


def test_chat_sse_framing(app):
    body = dict(CHAT, stream=True, stream_options={"include_usage": True}, regex="hi there")
    status, raw = call(app, "POST", "/v1/chat/completions", body)
    assert status == 200
    chunks, last = sse_events(raw)
    assert last == "[DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    with_choices = [c for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in with_choices) == "hi there"
    finishes = [c["choices"][0]["finish_reason"] for c in with_choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == []  # the usage chunk comes last
    usage = chunks[-1]["usage"]
    # the oracle: the engine's own (non-streaming) answer to the same prompt and constraint
    ids = prompt_ids(app.state.radixgen.engine, CHAT["messages"])
    ref = app.state.radixgen.engine.generate(input_ids=ids, sampling_params={"regex": "hi there", "temperature": 0})
    assert ref["text"] == "hi there"
    assert usage["prompt_tokens"] == len(ids)
    assert usage["completion_tokens"] == ref["meta_info"]["completion_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_chat_sse_free_text_matches_the_engine(app):
    """Unconstrained greedy text streamed in deltas adds up to the engine's own answer; no usage chunk
    unless asked for."""
    eng = app.state.radixgen.engine
    status, raw = call(app, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=8, stream=True))
    assert status == 200
    chunks, last = sse_events(raw)
    assert last == "[DONE]" and all(c["choices"] for c in chunks) and "usage" not in chunks[-1]
    ref = eng.generate(input_ids=prompt_ids(eng, CHAT["messages"]), sampling_params={"max_new_tokens": 8,
                                                                                      "temperature": 0})
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == ref["text"]
    want = "length" if ref["meta_info"]["finish_reason"]["type"] == "length" else "stop"
    assert chunks[-1]["choices"][0]["finish_reason"] == want


# ---------------------------------------------------------------------------------------------- tools


def test_parse_tool_calls_on_literal_text():
    def parsed(text: str, names=("get_weather",)) -> list[tuple[str, dict]] | None:
        calls = parse_tool_calls(text, list(names))
        return None if calls is None else [(c.function.name, json.loads(c.function.arguments)) for c in calls]

    rome = [("get_weather", {"city": "Rome"})]
    assert parsed(ROME_CALL) == rome
    assert parsed(f"  {ROME_CALL}\n") == rome
    assert parsed(f"<tool_call>{ROME_CALL}</tool_call>") == rome
    assert parsed(f"```json\n{ROME_CALL}\n```") == rome
    assert parsed(f"Sure, calling it: {ROME_CALL}") == rome  # a call after some text
    assert parsed('{"name": "get_weather", "parameters": {"city": "Rome"}}') == rome  # `parameters` alias
    assert parsed('{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}') == rome  # arguments as text
    two = '[{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_time", "arguments": {}}]'
    assert parsed(two, ("get_weather", "get_time")) == [*rome, ("get_time", {})]
    assert parsed(two) is None  # get_time is not a tool here
    assert parsed('{"name": "get_weather"}') == [("get_weather", {})]
    calls = parse_tool_calls(two, ["get_weather", "get_time"])
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") and c.type == "function" for c in calls)
    for not_a_call in ["hi there", "", '{"name": "other", "arguments": {}}', '{"city": "Rome"}', "{not json}",
                       '{"name": "get_weather", "arguments": "{bad"}', "[1, 2]"]:
        assert parsed(not_a_call) is None, not_a_call


def test_tool_choice_schema_and_prompt(app):
    req = ChatCompletionRequest(**NAMED)
    mode, names = tool_mode(req)
    assert (mode, names) == ("named", ["get_weather"])
    schema = tool_schema(req, mode, names)
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["properties"]["arguments"] == WEATHER["function"]["parameters"]
    required = ChatCompletionRequest(**dict(NAMED, tool_choice="required"))
    assert tool_schema(required, *tool_mode(required))["type"] == "array"
    single = ChatCompletionRequest(**dict(NAMED, tool_choice="required", parallel_tool_calls=False))
    assert tool_schema(single, *tool_mode(single))["properties"]["name"] == {"const": "get_weather"}
    auto = ChatCompletionRequest(**dict(CHAT, tools=[WEATHER]))
    assert tool_mode(auto) == ("auto", ["get_weather"]) and tool_schema(auto, "auto", ["get_weather"]) is None
    state = app.state.radixgen
    prompt = render(state, *build_messages(state, req, mode))
    assert "get_weather" in prompt and "hello" in prompt  # the tools are described to the model
    none = ChatCompletionRequest(**dict(NAMED, tool_choice="none"))
    assert "get_weather" not in render(state, *build_messages(state, none, "none"))


def test_named_and_required_tool_choice_constrain_the_output(app):
    jsonschema = pytest.importorskip("jsonschema")
    params = WEATHER["function"]["parameters"]
    out = chat(app, NAMED)["choices"][0]
    assert out["finish_reason"] == "tool_calls" and "content" not in out["message"]
    (tc,) = out["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["id"].startswith("call_")
    assert tc["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(tc["function"]["arguments"]), params)
    # required, one call (a random model could make an unconstrained-length array of calls; that
    # schema is checked in test_tool_choice_schema_and_prompt)
    out = chat(app, dict(NAMED, tool_choice="required", parallel_tool_calls=False))["choices"][0]
    (tc,) = out["message"]["tool_calls"]
    assert out["finish_reason"] == "tool_calls" and tc["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(tc["function"]["arguments"]), params)
    status, raw = call(app, "POST", "/v1/chat/completions", dict(NAMED, stream=True))
    assert status == 200
    chunks, last = sse_events(raw)
    assert last == "[DONE]"
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)  # held back as a call
    deltas = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert len(deltas) == 1 and deltas[0]["index"] == 0 and deltas[0]["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(deltas[0]["function"]["arguments"]), params)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_auto_tool_choice_parses_a_call_out_of_the_text(app):
    # the text is forced with a regex: a JSON call is parsed into tool_calls, plain text stays content
    out = chat(app, dict(CHAT, tools=[WEATHER], regex=ROME_REGEX, max_tokens=100))["choices"][0]
    assert out["finish_reason"] == "tool_calls" and "content" not in out["message"]
    (tc,) = out["message"]["tool_calls"]
    assert tc["function"]["name"] == "get_weather" and json.loads(tc["function"]["arguments"]) == {"city": "Rome"}
    plain = chat(app, dict(CHAT, tools=[WEATHER], regex="hi there"))["choices"][0]
    assert plain["message"] == {"role": "assistant", "content": "hi there"} and plain["finish_reason"] == "stop"
    status, raw = call(app, "POST", "/v1/chat/completions", dict(CHAT, tools=[WEATHER], regex=ROME_REGEX,
                                                                max_tokens=100, stream=True))
    chunks, last = sse_events(raw)
    assert status == 200 and last == "[DONE]"
    deltas = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [(d["function"]["name"], json.loads(d["function"]["arguments"])) for d in deltas] == \
        [("get_weather", {"city": "Rome"})]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    status, raw = call(app, "POST", "/v1/chat/completions", dict(CHAT, tools=[WEATHER], regex="hi there",
                                                                stream=True))
    chunks, _ = sse_events(raw)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "hi there"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# ---------------------------------------------------------------------------------------------- metrics

SAMPLE = re.compile(r'^(radixgen_\w+)\{model_name="tiny"(?:,le="([^"]+)")?\} (\S+)$')


def test_metrics_text_and_stats(app, tiny_engine):
    assert call(app, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=3))[0] == 200  # at least one request
    status, raw = call(app, "GET", "/metrics")
    assert status == 200
    oracle = tiny_engine.get_stats()  # idle now: the same numbers the endpoint read
    samples: dict[tuple[str, str | None], float] = {}
    types: dict[str, str] = {}
    for line in raw.decode().splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:]
            types[name] = kind
        elif not line.startswith("# HELP "):
            m = SAMPLE.match(line)
            assert m, line
            samples[m[1], m[2]] = float(m[3])
    assert samples["radixgen_kv_capacity_tokens", None] == oracle["kv_capacity"] == 4096
    assert samples["radixgen_kv_used_tokens", None] == oracle["kv_used"]
    assert samples["radixgen_kv_usage_ratio", None] == pytest.approx(oracle["kv_used"] / oracle["kv_capacity"])
    assert samples["radixgen_requests_arrived_total", None] == oracle["requests_arrived"] >= 1
    assert types["radixgen_requests_arrived_total"] == "counter" and types["radixgen_num_running_reqs"] == "gauge"
    assert samples["radixgen_num_running_reqs", None] == 0
    # an engine stat the exporter has no name for shows up as a gauge under its own name
    assert samples["radixgen_forward_steps", None] == oracle["forward_steps"] and types["radixgen_forward_steps"] == \
        "gauge"
    ttft = oracle["ttft"]
    assert types["radixgen_time_to_first_token_seconds"] == "histogram" and ttft.n >= 1
    total = 0
    for le, count in zip([*ttft.buckets, float("inf")], ttft.counts, strict=True):  # buckets are cumulative
        total += count
        key = "+Inf" if le == float("inf") else repr(float(le))
        assert samples["radixgen_time_to_first_token_seconds_bucket", key] == total, key
    assert total == ttft.n == samples["radixgen_time_to_first_token_seconds_count", None]
    assert samples["radixgen_time_to_first_token_seconds_sum", None] == pytest.approx(ttft.total)
    assert ("radixgen_inter_token_latency_seconds_bucket", "+Inf") in samples
    stats = json.loads(call(app, "GET", "/stats")[1])
    assert stats["kv_capacity"] == oracle["kv_capacity"] and stats["requests_arrived"] == oracle["requests_arrived"]
    assert stats["ttft"] == {"buckets": list(ttft.buckets), "counts": list(ttft.counts), "sum": ttft.total,
                             "count": ttft.n}


# ---------------------------------------------------------------------------------------------- real server


@pytest.mark.slow
def test_real_server_with_api_key(tiny_models, start_server):
    openai = pytest.importorskip("openai")
    srv = start_server("--model", str(tiny_models["llama"]), "--api-key", "sekrit", "--served-model-name", "tiny",
                       "--max-total-tokens", "4096")
    assert srv.get("/health")[0] == 200
    status, body = srv.get("/v1/models")
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, err = srv.post("/v1/chat/completions", body)  # no key at all
    assert status == 401 and err["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.chat.completions.create(**body)
    assert e.value.status_code == 401 and e.value.response.json()["error"]["code"] == "invalid_api_key"
    good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekrit", max_retries=0)
    out = good.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert out.usage.completion_tokens <= 2 and out.model == "tiny"
    status, body = srv.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                            headers={"Authorization": "Bearer sekrit"})
    assert status == 200 and len(body["output_ids"]) <= 2
