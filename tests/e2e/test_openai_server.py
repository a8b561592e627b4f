"""The OpenAI-compatible server end to end: the real `radixgen serve` (SmolLM2) driven by the official
openai client. Greedy decoding and small max_tokens everywhere."""

from __future__ import annotations

import http.client
import json
import time

import pytest
from tool_defs import TIME, WEATHER

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-instruct"  # the name the default model is served under

MSGS = [{"role": "user", "content": "Name three colors."}]


def chat(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", MSGS)
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(**kw)


# ---------------------------------------------------------------------------------------------- basics


def test_health_models_and_model_info(server, client):
    assert server.get("/health") == (200, '{"status":"ok"}')
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    status, info = server.get("/get_model_info")
    info = json.loads(info)
    assert status == 200 and "<|im_start|>" in info["chat_template"] and info["context_length"] > 0


def test_chat_stream_reassembles_to_the_non_stream_text(client):
    full = chat(client, max_tokens=12)
    choice = full.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert full.usage.completion_tokens <= 12 and full.usage.prompt_tokens > 10
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    chunks = list(chat(client, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    # the second identical prompt hit the radix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_completions_stream_equals_non_stream_and_echo(client):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    full = client.completions.create(**kw)
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert streamed == full.choices[0].text and full.choices[0].text
    echoed = client.completions.create(echo=True, **kw)
    assert echoed.choices[0].text == kw["prompt"] + full.choices[0].text
    many = client.completions.create(**dict(kw, prompt=["1, 2, 3,", kw["prompt"]]))
    assert [c.index for c in many.choices] == [0, 1] and many.choices[1].text == full.choices[0].text
    ids = client.completions.create(**dict(kw, prompt=[504, 3575, 282, 4649, 314]))  # token-id prompt
    assert ids.usage.prompt_tokens == 5 and ids.choices[0].text


def test_n3_and_seed(client):
    out = chat(client, n=3, temperature=1.0, seed=7, max_tokens=6)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.message.content for c in out.choices)
    again = chat(client, n=3, temperature=1.0, seed=7, max_tokens=6)
    assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]
    streamed = {}
    for c in chat(client, n=3, temperature=1.0, seed=7, max_tokens=6, stream=True):
        for ch in c.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + (ch.delta.content or "")
    assert [streamed[i] for i in range(3)] == [c.message.content for c in out.choices]


def test_chat_logprobs(client):
    out = chat(client, logprobs=True, top_logprobs=3, max_tokens=5)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert "".join(t.token for t in content) == out.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].token == t.token  # greedy: the sampled token is the argmax
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4
        assert bytes(t.bytes).decode() == t.token


def test_completion_logprobs_legacy_format(client):
    out = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=4, temperature=0,
                                    logprobs=2, echo=True)
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert lp.top_logprobs[0] is None and all(len(d) == 2 for d in lp.top_logprobs[1:])


def test_stop_string(client):
    free = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=10, temperature=0)
    assert "," in free.choices[0].text
    out = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=10, temperature=0, stop=[","])
    assert out.choices[0].text == free.choices[0].text.split(",")[0]
    assert out.choices[0].finish_reason == "stop"


def test_logit_bias_tokenize_detokenize(server, client):
    status, out = server.post("/tokenize", {"text": " the", "add_special_tokens": False})
    assert status == 200 and len(out["tokens"]) == 1
    tid = out["tokens"][0]
    assert server.post("/detokenize", {"tokens": [tid]}) == (200, {"text": " the"})
    biased = chat(client, logit_bias={str(tid): 100}, max_tokens=3)
    assert biased.choices[0].message.content == " the the the"


def test_native_generate(server):
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    status, out = server.post("/generate", body)
    assert status == 200 and out["meta_info"]["completion_tokens"] == len(out["output_ids"]) <= 6
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/generate", json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
    events = [ln[6:] for ln in conn.getresponse().read().decode().splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(out["text"].startswith(c["text"]) for c in chunks)  # cumulative per event, as SGLang's server
    assert chunks[-1]["text"] == out["text"] and chunks[-1]["output_ids"] == out["output_ids"]
    status, outs = server.post("/generate", {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and len(outs) == 2


def test_metrics_text(server, client):
    chat(client, max_tokens=3)
    status, text = server.get("/metrics")
    assert status == 200
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
                 "sglang:gen_throughput", "sglang:time_to_first_token_seconds_bucket",
                 "sglang:inter_token_latency_seconds_count"):
        assert name in text, name
    buckets = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("sglang:time_to_first_token_seconds_bucket") and 'is_streaming="false"' in ln]
    assert buckets == sorted(buckets) and buckets[-1] >= 1  # cumulative, +Inf last
    assert 'le="+Inf"' in text


# ---------------------------------------------------------------------------------------------- constraints


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


def test_response_format_json_schema(client, needs_constraints):
    jsonschema = pytest.importorskip("jsonschema")
    msgs = [{"role": "user", "content": "Give me a person as JSON."}]
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    out = chat(client, messages=msgs, response_format=rf, max_tokens=40)
    jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       chat(client, messages=msgs, response_format=rf, max_tokens=40, stream=True) if c.choices)
    assert streamed == out.choices[0].message.content
    obj = chat(client, messages=msgs, response_format={"type": "json_object"}, max_tokens=40)
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    regex = chat(client, messages=msgs, extra_body={"regex": "[0-9]{3}"}, max_tokens=5)
    assert len(regex.choices[0].message.content) == 3 and regex.choices[0].message.content.isdigit()


@pytest.mark.parametrize("choice", ["required", "named"])
def test_tool_choice_gives_valid_arguments(client, needs_constraints, choice):
    jsonschema = pytest.importorskip("jsonschema")
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "get_weather"}}
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
    out = chat(client, messages=msgs, tools=[WEATHER, TIME], tool_choice=tool_choice, max_tokens=60,
               parallel_tool_calls=False)
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    tools = {"get_weather": WEATHER, "get_time": TIME}
    if choice == "named":
        assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), tools[call.function.name]["function"]["parameters"])
    chunks = list(chat(client, messages=msgs, tools=[WEATHER, TIME], tool_choice=tool_choice, max_tokens=60,
                       parallel_tool_calls=False, stream=True))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas if d.id] == [call.function.name]  # the first delta names it
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments  # fragments after
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
        ["tool_calls"]


def test_tool_choice_required_parallel_is_a_list(client, needs_constraints):
    out = chat(client, messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER],
               tool_choice="required", max_tokens=80)
    calls = out.choices[0].message.tool_calls
    if out.choices[0].finish_reason == "tool_calls":
        assert calls and all(c.function.name == "get_weather" for c in calls)
        for c in calls:
            assert set(json.loads(c.function.arguments)) == {"city", "unit"}


def test_tool_choice_auto_and_none_answer_with_a_message(client):
    for tool_choice in ("auto", "none"):
        out = chat(client, tools=[WEATHER], tool_choice=tool_choice, max_tokens=10)
        c = out.choices[0]
        if c.message.tool_calls:  # auto may call it; then the arguments are JSON
            assert tool_choice == "auto" and c.finish_reason == "tool_calls"
            json.loads(c.message.tool_calls[0].function.arguments)
        else:
            assert c.message.content and c.finish_reason in ("stop", "length")


def test_tool_conversation_round_trip(client):
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"}]
    out = chat(client, messages=msgs, tools=[WEATHER], max_tokens=8)
    assert out.choices[0].message.content or out.choices[0].message.tool_calls


# ---------------------------------------------------------------------------------------------- errors


def _error(exc_info, status: int) -> dict:
    assert exc_info.value.status_code == status
    body = exc_info.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    return body["error"]


def test_error_bad_parameter(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, temperature=-1)
    assert _error(e, 400)["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, top_p=0)
    assert _error(e, 400)["param"] == "top_p"
    with pytest.raises(openai.BadRequestError) as e:  # pydantic validation: 400, not FastAPI's 422
        chat(client, messages=[{"role": "wizard", "content": "x"}])
    assert _error(e, 400)["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, tool_choice="required")  # no tools
    assert _error(e, 400)["param"] == "tool_choice"


def test_error_bad_schema(client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, response_format=bad)
    err = _error(e, 400)
    assert err["param"] == "response_format" and "wat" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, extra_body={"regex": "(unclosed"})
    assert _error(e, 400)["param"] == "regex"
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, stream=True, response_format=bad)
    _error(e, 400)


def test_error_unknown_model_and_route(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        chat(client, model="gpt-17")
    assert _error(e, 404)["code"] == "model_not_found"
    status, body = server.post("/v1/nothing/here", {})
    assert status == 404 and body["error"]["code"] == "not_found"


def test_unknown_fields_are_ignored_by_default(client):
    """As SGLang and vLLM do (the fuzz test's server refuses them with --reject-unknown-fields): the
    output is the same as without the fields."""
    plain = chat(client).choices[0].message.content
    extra = {"store": False, "metadata": {"run": "1"}, "frobnicate": [1, 2]}
    assert chat(client, extra_body=extra).choices[0].message.content == plain


def test_error_context_length(client):
    long = "hello " * 9000
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages=[{"role": "user", "content": long}])
    assert _error(e, 400)["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=long, max_tokens=2, stream=True)
    assert _error(e, 400)["code"] == "context_length_exceeded"


# ---------------------------------------------------------------------------------------------- disconnect


def _kv_after_flush(server, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, out = server.post("/flush_cache", {})
        if status == 200 and out["success"]:
            return json.loads(server.get("/stats")[1])["kv_used"]
        time.sleep(0.1)
    raise AssertionError("flush_cache kept returning false: a request is still running")


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": MODEL, "messages": MSGS, "max_tokens": 400, "ignore_eos": True,
                              "stream": True}),
    ("/v1/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}),
])
def test_client_disconnect_aborts_the_request(server, path, body):
    idle = _kv_after_flush(server)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    if body.get("stream"):
        resp = conn.getresponse()
        assert resp.status == 200
        for _ in range(4):  # a few events arrive, then the client goes away mid-stream
            resp.fp.readline()
    else:
        deadline = time.monotonic() + 30  # wait until it runs, then go away before the answer
        while json.loads(server.get("/stats")[1])["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    conn.sock.shutdown(2)
    conn.close()
    t = time.monotonic()
    assert _kv_after_flush(server) == idle
    assert time.monotonic() - t < 10  # aborted, not run to its 400 tokens
    stats = json.loads(server.get("/stats")[1])
    assert stats["running"] == 0 and stats["waiting"] == 0
