"""Cheap server checks: the API key on a real `radixgen serve --api-key` (a tiny random model), and the
app's error paths, SSE framing, tool calls and metrics driven in process over raw ASGI (no sockets) on a
real Engine over a tiny random-weight llama with the SmolLM2 tokenizer. Output a random model cannot be
relied on to produce is forced with a grammar constraint (`regex`, or a named / required tool choice)."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixgen.runtime.engine import Engine
from radixgen.runtime.server import create_app

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


def streamed_calls(chunks: list[dict]) -> list[tuple[str, str]]:
    """(name, arguments) of the tool calls in streamed chunks: a call's first delta names it, later
    ones carry fragments of its arguments."""
    calls: dict[int, list[str]] = {}
    for c in chunks:
        for d in c["choices"][0]["delta"].get("tool_calls", []):
            if "id" in d:
                calls[d["index"]] = [d["function"]["name"], ""]
            calls[d["index"]][1] += d["function"].get("arguments", "")
    return [(n, a) for n, a in calls.values()]


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
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)  # the reply is the call
    assert [(n, json.loads(a)) for n, a in streamed_calls(chunks)] == [("get_weather", json.loads(
        chat(app, NAMED)["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]))]
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
    assert [(n, json.loads(a)) for n, a in streamed_calls(chunks)] == [("get_weather", {"city": "Rome"})]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    status, raw = call(app, "POST", "/v1/chat/completions", dict(CHAT, tools=[WEATHER], regex="hi there",
                                                                stream=True))
    chunks, _ = sse_events(raw)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "hi there"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# ---------------------------------------------------------------------------------------------- metrics

def test_metrics_text_and_stats(app, tiny_engine):
    assert call(app, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=3))[0] == 200  # at least one request
    status, raw = call(app, "GET", "/metrics")
    assert status == 200
    oracle = tiny_engine.get_stats()  # idle now: the same numbers the endpoint read
    samples = {(s.name, s.labels.get("le")): s.value for f in text_string_to_metric_families(raw.decode())
               for s in f.samples if s.labels.get("model_name", "tiny") == "tiny"}
    assert samples["sglang:max_total_num_tokens", None] == oracle["kv_capacity"] == 4096
    assert samples["sglang:kv_available_tokens", None] == oracle["kv_capacity"] - oracle["kv_used"]
    assert samples["sglang:kv_evictable_tokens", None] == oracle["kv_evictable"]
    assert samples["sglang:num_running_reqs", None] == 0 and samples["sglang:token_usage", None] == 0
    assert samples["radixgen:forward_steps_total", None] == oracle["forward_steps"]
    itl = oracle["itl"]
    assert itl.n >= 1
    total = 0
    for le, count in zip([*itl.buckets, float("inf")], itl.counts, strict=True):  # buckets are cumulative
        total += count
        key = "+Inf" if le == float("inf") else str(float(le))
        assert samples["sglang:inter_token_latency_seconds_bucket", key] == total, key
    assert total == itl.n == samples["sglang:inter_token_latency_seconds_count", None]
    assert samples["sglang:inter_token_latency_seconds_sum", None] == pytest.approx(itl.total)
    stats = json.loads(call(app, "GET", "/stats")[1])
    assert stats["kv_capacity"] == oracle["kv_capacity"] and stats["requests_arrived"] == oracle["requests_arrived"]
    assert stats["itl"] == {"buckets": list(itl.buckets), "counts": list(itl.counts), "sum": itl.total,
                            "count": itl.n}


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
