"""Cheap server checks: the API key on a real `radixgen serve --api-key` (a tiny random model), and the
app's error paths, SSE framing and tool-call parsing driven in process over raw ASGI with a fake
engine (no model, no sockets)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from radixgen.runtime.metrics import Histogram
from radixgen.runtime.server import create_app

# ---------------------------------------------------------------------------------------------- fake engine


class FakeTokenizer:
    """One token per character (id = code point); a ChatML-like template."""

    vocab_size = 512
    eos_token_ids = [0]
    chat_template = "chatml"
    hf = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [min(ord(c), 511) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None) -> str:
        out = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return out + ("<assistant>" if add_generation_prompt else "")


class FakeEngine:
    """Answers `reply` (or, when constrained by a JSON schema, a canned tool call) one char per chunk."""

    context_length = 1024

    def __init__(self, reply: str = "hi there") -> None:
        self.tokenizer = FakeTokenizer()
        self.config = SimpleNamespace(model=None, disable_radix_cache=True)
        self.reply = reply
        self.calls: list[dict] = []

    def _text(self, sp: dict) -> str:
        if "json_schema" in sp:
            schema = json.loads(sp["json_schema"])
            call = {"name": "get_weather", "arguments": {"city": "Paris"}}
            return json.dumps([call] if schema.get("type") == "array" else call)
        return self.reply

    async def async_generate(self, input_ids=None, sampling_params=None, stream=False, **kw):
        sp = dict(sampling_params or {})
        self.calls.append(dict(kw, input_ids=input_ids, sampling_params=sp, stream=stream))
        if sp.get("temperature", 1) < 0:
            raise ValueError(f"temperature must be a number in [0, inf), got {sp['temperature']}")
        text = self._text(sp)[: sp.get("max_new_tokens", 128)]
        fin = {"type": "stop", "matched": 0}
        meta = {"prompt_tokens": len(input_ids), "completion_tokens": len(text), "cached_tokens": 0}
        if not stream:
            out = {"text": text, "output_ids": [ord(c) for c in text], "meta_info": dict(meta, finish_reason=fin)}
            return [out] * sp["n"] if sp.get("n", 1) > 1 else out

        async def chunks():
            for i, c in enumerate(text):
                await asyncio.sleep(0)
                last = i == len(text) - 1
                yield {"text": c, "output_ids": [ord(c)], "meta_info": dict(meta, finish_reason=fin if last else None)}

        return chunks()

    def get_stats(self) -> dict:
        h = Histogram()
        h.observe(0.02)
        h.observe(0.3)
        return {"running": 0, "waiting": 0, "kv_used": 3, "kv_capacity": 100, "kv_evictable": 3,
                "cache_hit_rate": 0.5, "prompt_throughput": 1.0, "generation_throughput": 2.0,
                "requests_arrived": 2, "requests_finished": 2, "ttft": h, "itl": Histogram(), "new_stat": 4}

    def flush_cache(self) -> bool:
        return True


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


CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 20}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture
def app():
    return create_app(FakeEngine(), model_name="fake")


# ---------------------------------------------------------------------------------------------- in process


def test_api_key_gate():
    keyed = create_app(FakeEngine(), api_key="sekrit", model_name="fake")
    assert error_of(call(keyed, "GET", "/v1/models"), 401)["code"] == "invalid_api_key"
    error_of(call(keyed, "POST", "/v1/chat/completions", CHAT, {"Authorization": "Bearer wrong"}), 401)
    assert call(keyed, "POST", "/v1/chat/completions", CHAT, {"Authorization": "Bearer sekrit"})[0] == 200
    assert call(keyed, "GET", "/health")[0] == 200  # open for load balancers


def test_draining_gives_503(app):
    app.state.radixgen.draining = True
    assert error_of(call(app, "POST", "/v1/chat/completions", CHAT), 503)["code"] == "shutting_down"
    assert call(app, "GET", "/health")[0] == 503


def test_error_shapes(app):
    assert error_of(call(app, "POST", "/v1/chat/completions", {"model": "fake"}), 400)["param"] == "messages"
    assert error_of(call(app, "POST", "/v1/chat/completions", dict(CHAT, temperature=-1)), 400)["param"] == \
        "temperature"
    assert error_of(call(app, "POST", "/v1/chat/completions", dict(CHAT, model="x")), 404)["code"] == \
        "model_not_found"
    assert error_of(call(app, "GET", "/nope"), 404)["code"] == "not_found"
    long = dict(CHAT, messages=[{"role": "user", "content": "x" * 2000}])
    assert error_of(call(app, "POST", "/v1/chat/completions", long), 400)["code"] == "context_length_exceeded"
    assert error_of(call(app, "POST", "/v1/completions", {"model": "fake", "prompt": "y" * 2000}), 400)["code"] == \
        "context_length_exceeded"
    bad = dict(CHAT, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}})
    assert error_of(call(app, "POST", "/v1/chat/completions", bad), 400)["param"] == "response_format"
    both = dict(CHAT, response_format={"type": "json_object"}, regex="a+")
    error_of(call(app, "POST", "/v1/chat/completions", both), 400)
    image = dict(CHAT, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert error_of(call(app, "POST", "/v1/chat/completions", image), 400)["param"] == "messages"
    assert error_of(call(app, "POST", "/v1/completions", {"model": "fake", "prompt": "a", "suffix": "b"}), 400)[
        "param"] == "suffix"


def test_chat_sse_framing(app):
    status, raw = call(app, "POST", "/v1/chat/completions",
                       dict(CHAT, stream=True, stream_options={"include_usage": True}))
    assert status == 200
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "hi there"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8


def test_tool_choice_builds_a_schema_and_parses_calls():
    eng = FakeEngine()
    app = create_app(eng, model_name="fake")
    named = dict(CHAT, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 max_tokens=200)
    status, raw = call(app, "POST", "/v1/chat/completions", named)
    out = json.loads(raw)["choices"][0]
    assert status == 200 and out["finish_reason"] == "tool_calls" and "content" not in out["message"]
    (tc,) = out["message"]["tool_calls"]
    assert tc["function"]["name"] == "get_weather" and json.loads(tc["function"]["arguments"]) == {"city": "Paris"}
    schema = json.loads(eng.calls[-1]["sampling_params"]["json_schema"])
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["properties"]["arguments"] == WEATHER["function"]["parameters"]
    prompt = FakeTokenizer().decode(eng.calls[-1]["input_ids"])
    assert "get_weather" in prompt  # described in the system prompt (this template ignores tools=)
    status, raw = call(app, "POST", "/v1/chat/completions", dict(named, tool_choice="required"))
    assert json.loads(eng.calls[-1]["sampling_params"]["json_schema"])["type"] == "array"
    assert json.loads(raw)["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    status, raw = call(app, "POST", "/v1/chat/completions", dict(named, stream=True))
    chunks = [json.loads(e.removeprefix("data: ")) for e in raw.decode().split("\n\n") if e and "[DONE]" not in e]
    deltas = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert len(deltas) == 1 and deltas[0]["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # auto: a JSON call in free text is parsed; plain text stays content
    auto = create_app(FakeEngine('{"name": "get_weather", "arguments": {"city": "Rome"}}'), model_name="fake")
    out = json.loads(call(auto, "POST", "/v1/chat/completions", dict(CHAT, tools=[WEATHER], max_tokens=200))[1])[
        "choices"][0]
    assert out["finish_reason"] == "tool_calls"
    plain = json.loads(call(app, "POST", "/v1/chat/completions", dict(CHAT, tools=[WEATHER]))[1])["choices"][0]
    assert plain["message"]["content"] == "hi there" and plain["finish_reason"] == "stop"


def test_metrics_text_and_stats(app):
    status, raw = call(app, "GET", "/metrics")
    text = raw.decode()
    assert status == 200
    assert 'radixgen_kv_used_tokens{model_name="fake"} 3' in text
    assert 'radixgen_time_to_first_token_seconds_bucket{model_name="fake",le="0.025"} 1' in text
    assert 'radixgen_time_to_first_token_seconds_bucket{model_name="fake",le="+Inf"} 2' in text
    assert 'radixgen_time_to_first_token_seconds_count{model_name="fake"} 2' in text
    assert 'radixgen_new_stat{model_name="fake"} 4' in text  # unknown numeric stats are exported too
    stats = json.loads(call(app, "GET", "/stats")[1])
    assert stats["kv_used"] == 3 and stats["ttft"]["count"] == 2


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
