"""Forced tool calls in the mistral, pythonic and qwen3_coder formats, end to end: the official `openai`
client over the app in this process (httpx's ASGI transport), a real Engine on a tiny random llama.

A random model writes whatever its grammar allows, so each reply is the forcing grammar's work: the
call must come back parsed in that format, its arguments valid for the tool's schema
(python-jsonschema), streamed and folded alike; the raw text (the native /generate with the same
constraint) must be in the format's syntax.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from radixgen.runtime.engine import Engine
from radixgen.runtime.server import create_app
from radixgen.runtime.server.options import ServerOptions

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                     "detailed": {"type": "boolean"}},
    "required": ["city", "unit", "detailed"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "maxLength": 8}}, "required": ["tz"]}}}
SYNTAX = {"mistral": "[TOOL_CALLS] [{", "pythonic": "[get_weather(city=", "qwen3_coder": "<tool_call>\n<function="}


@pytest.fixture(scope="module")
def tiny_engine(tiny_models):
    eng = Engine(model=str(tiny_models["llama"]), context_length=1024, max_total_tokens=4096)
    yield eng
    eng.shutdown()


def client_of(app):
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tiny")
    return openai.AsyncOpenAI(base_url="http://tiny/v1", api_key="unused", http_client=http, max_retries=0)


async def forced_call(client, **choice) -> tuple[str, dict]:
    """One forced call, streamed and not: (name, arguments), checked to agree and to fit the schema."""
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER, TIME],
              temperature=0, max_tokens=150, parallel_tool_calls=False, **choice)
    full = await client.chat.completions.create(**kw)
    assert full.choices[0].finish_reason == "tool_calls", full
    (call,) = full.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"])
    streamed: dict[int, list[str]] = {}
    async for ch in await client.chat.completions.create(stream=True, **kw):
        for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            streamed.setdefault(d.index, [d.function.name, ""])[1] += d.function.arguments or ""
    assert streamed == {0: [call.function.name, call.function.arguments]}
    return call.function.name, args


@pytest.mark.parametrize("fmt", list(SYNTAX))
def test_forced_calls_in_each_format(tiny_engine, fmt):
    app = create_app(tiny_engine, model_name="tiny", tool_call_parser=fmt)
    client = client_of(app)

    async def run() -> None:  # a named function (`required` takes the same path with more tags)
        name, _ = await forced_call(client, tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert name == "get_weather"

    asyncio.run(run())
    # the text the grammar forced is the format's syntax (the constraint a chat request gets, on /generate)
    from radixgen.runtime.server.chat_prompt import constraint, tool_setup
    from radixgen.runtime.server.protocol import ChatCompletionRequest

    state = app.state.radixgen
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=[WEATHER, TIME],
                                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    params, _ = constraint(state, req, {}, tool_setup(state, req), None)
    out = tiny_engine.generate("Weather?", {**params, "temperature": 0, "max_new_tokens": 150})
    assert out["text"].startswith(SYNTAX[fmt]) and out["meta_info"]["finish_reason"]["type"] == "stop", out["text"]


def test_mistral_compact_form_where_the_template_writes_it(tiny_engine, tmp_path):
    template = tmp_path / "mistral_like.jinja"
    template.write_text("{%- for m in messages %}[INST]{{ m['content'] }}[/INST]{%- endfor %}"
                        "{#- calls are written [TOOL_CALLS]name[ARGS]{...} #}")
    app = create_app(tiny_engine, model_name="tiny", tool_call_parser="mistral",
                     options=ServerOptions(chat_template=str(template)))

    async def run() -> None:
        assert (await forced_call(client_of(app), tool_choice="required"))[0] in ("get_weather", "get_time")

    asyncio.run(run())
