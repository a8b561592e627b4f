"""The Responses API (`/v1/responses`) end to end: the session's real `radixgen serve` (SmolLM2) driven
by the official openai client and by the OpenAI Agents SDK.

The oracle for what a request means is the chat completions endpoint: the same conversation sent as
chat messages must give the same prompt (input tokens) and, greedy, the same reply. Forced tool
choices and JSON schemas (grammar-constrained) pin down what the tiny model writes; JSON output is
checked with python-jsonschema."""

from __future__ import annotations

import asyncio
import json
import time
from itertools import groupby

import pytest
from pydantic import BaseModel, Field
from tool_defs import WEATHER

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

MODEL = "smollm2-135m-instruct"
WEATHER_FN = {"type": "function", **WEATHER["function"]}  # the Responses API's flat function tool
ASK = "What is the weather in Paris?"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                         "country": {"type": "string", "maxLength": 12}},
        "required": ["city", "country"], "additionalProperties": False}


def create(client, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 12)
    return client.responses.create(**kw)


def chat(client, messages: list[dict], max_tokens: int = 12, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, **kw)


def runs(events) -> list[str]:
    """Event types with runs of one type (deltas) counted once."""
    return [k for k, _ in groupby(e.type for e in events)]


def kv_after_flush(server, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, out = server.post("/flush_cache", {})
        if status == 200 and out["success"]:
            return json.loads(server.get("/stats")[1])["kv_used"]
        time.sleep(0.2)
    raise AssertionError("flush_cache kept answering busy")


def test_text_and_items_are_the_chat_request_they_mean(client):
    r = create(client, input="Name three colors.")
    want = chat(client, [{"role": "user", "content": "Name three colors."}])
    assert r.object == "response" and r.model == MODEL and r.id.startswith("resp_")
    assert r.output_text == want.choices[0].message.content and r.output_text
    assert (r.usage.input_tokens, r.usage.output_tokens) == (want.usage.prompt_tokens, want.usage.completion_tokens)
    assert (r.status == "incomplete") == (want.choices[0].finish_reason == "length")
    [msg] = r.output
    assert (msg.type, msg.role, msg.content[0].type) == ("message", "assistant", "output_text")

    parts = [{"type": "input_text", "text": "Which color "}, {"type": "input_text", "text": "is the sky?"}]
    items = [{"role": "developer", "content": "Answer in one word."}, {"type": "message", "role": "user",
                                                                       "content": parts}]
    r = create(client, input=items, instructions="You are terse.")
    want = chat(client, [{"role": "system", "content": "You are terse."}, {"role": "developer", "content":
                "Answer in one word."}, {"role": "user", "content": "Which color is the sky?"}])
    assert r.output_text == want.choices[0].message.content and r.usage.input_tokens == want.usage.prompt_tokens
    got = client.responses.retrieve(r.id)  # stored by default
    assert (got.id, got.status, got.output_text, got.usage) == (r.id, r.status, r.output_text, r.usage)
    assert got.instructions == "You are terse."


def test_a_forced_call_and_its_output_continue_like_chat(client):
    named = create(client, input=ASK, tools=[WEATHER_FN], tool_choice={"type": "function", "name": "get_weather"},
                   max_output_tokens=40)
    [call] = named.output
    assert (call.type, call.name, call.status) == ("function_call", "get_weather", "completed")
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and named.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    required = create(client, input=ASK, tools=[WEATHER_FN], tool_choice="required", parallel_tool_calls=False,
                      max_output_tokens=40)
    assert [o.type for o in required.output] == ["function_call"]

    # the call (as returned) and its result fed back: the prompt a chat client's assistant + tool turn makes
    follow = [{"role": "user", "content": ASK}, call.to_dict(),
              {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}]
    r = create(client, input=follow, tools=[WEATHER_FN], tool_choice="none")
    want = chat(client, [{"role": "user", "content": ASK},
                         {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function",
                          "function": {"name": "get_weather", "arguments": call.arguments}}]},
                         {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"}],
                tools=[WEATHER], tool_choice="none")
    assert r.output_text == want.choices[0].message.content and r.usage.input_tokens == want.usage.prompt_tokens


def test_json_schema_text_format_and_parse(client):
    fmt = {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}
    r = create(client, input="Name a city and its country.", text={"format": fmt}, max_output_tokens=40)
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), CITY)

    class City(BaseModel):
        city: str = Field(max_length=12)
        country: str = Field(max_length=12)

    parsed = client.responses.parse(model=MODEL, input="Name a city and its country.", text_format=City,
                                    max_output_tokens=40, temperature=0)
    assert isinstance(parsed.output_parsed, City) and parsed.output_parsed.city


def test_stream_events_in_order(client):
    kw = dict(input="Name three colors.", max_output_tokens=24)
    full = create(client, **kw)
    assert full.status == "completed"
    with client.responses.stream(model=MODEL, temperature=0, **kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert runs(events) == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert len(deltas) > 1 and "".join(e.delta for e in deltas) == done.text == final.output_text == full.output_text
    item = events[2].item
    assert {e.item_id for e in deltas} == {item.id} and events[0].response.status == "in_progress"
    assert final.usage.output_tokens == full.usage.output_tokens and final.id == events[0].response.id

    calls = list(create(client, input=ASK, tools=[WEATHER_FN], tool_choice="required", max_output_tokens=40,
                        stream=True))
    assert runs(calls) == ["response.created", "response.in_progress", "response.output_item.added",
                           "response.function_call_arguments.delta", "response.function_call_arguments.done",
                           "response.output_item.done", "response.completed"]
    arguments = "".join(e.delta for e in calls if e.type == "response.function_call_arguments.delta")
    assert arguments == calls[4 + sum(e.type.endswith("arguments.delta") for e in calls) - 1].arguments
    assert calls[-1].response.output[0].arguments == arguments and calls[2].item.name == "get_weather"

    cut = list(create(client, input="Count to twenty.", max_output_tokens=3, stream=True))
    assert cut[-1].type == "response.incomplete" and cut[-1].response.incomplete_details.reason == "max_output_tokens"
    assert cut[-2].type == "response.output_item.done" and cut[-2].item.status == "incomplete"


def test_previous_response_id_chains_turns_through_the_cache(client):
    turns = ["Name a fruit.", "Name another one.", "And a third one?"]
    said, prev, out = [], None, []
    for text in turns:
        r = create(client, input=text, previous_response_id=prev, max_output_tokens=8)
        out.append(r)
        said += [{"role": "user", "content": text}, {"role": "assistant", "content": r.output_text}]
        prev = r.id
    inputs = [r.usage.input_tokens for r in out]
    cached = [r.usage.input_tokens_details.cached_tokens for r in out]
    # each turn's prompt starts with the previous turn's whole prompt, which the radix cache holds
    assert cached[1] >= inputs[0] > 0 and cached[2] >= inputs[1] > inputs[0]
    want = chat(client, said[:-1], max_tokens=8)  # the same conversation as chat messages
    assert (want.usage.prompt_tokens, want.choices[0].message.content) == (inputs[2], out[2].output_text)

    unstored = create(client, input="Hi.", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        create(client, input="Hi.", previous_response_id=unstored.id)


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "tools": [WEATHER_FN], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "bogus"}}}},
     "text.format"),
    ({"input": "x", "stream": True, "text": {"format": {"type": "json_schema", "name": "a", "schema": {
        "type": "bogus"}}}}, "text.format"),
    ({"input": "x", "max_output_tokens": 10 ** 6}, "max_output_tokens"),
    ({"input": "x", "temperature": -1}, "temperature"),
    ({"input": "x", "background": True, "store": False}, "background"),
    ({"input": "x", "background": True, "stream": True}, "stream"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "previous_response_id": "resp_unknown"}, "previous_response_id"),
])
def test_bad_input_is_an_error_naming_the_field(server, body, param):
    status, out = server.post("/v1/responses", {"model": MODEL, **body})
    assert status == (404 if param == "previous_response_id" else 400), out
    assert set(out["error"]) == {"message", "type", "param", "code"} and out["error"]["param"] == param, out
    assert server.post("/v1/responses", {"model": MODEL, "input": "Hi.", "max_output_tokens": 1})[0] == 200


def test_background_cancel_get_and_delete(client, server):
    long = create(client, input="Write a story.", background=True, max_output_tokens=1000,
                  extra_body={"ignore_eos": True})
    assert long.status == "queued" and long.background
    assert client.responses.retrieve(long.id).status in ("queued", "in_progress")
    assert client.responses.cancel(long.id).status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"

    short = create(client, input="Name three colors.", background=True, max_output_tokens=24)
    deadline = time.monotonic() + 60
    while (done := client.responses.retrieve(short.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert done.status == "completed" and done.output_text == create(client, input="Name three colors.",
                                                                      max_output_tokens=24).output_text
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(create(client, input="Hi.", max_output_tokens=2).id)  # not a background one

    client.responses.delete(long.id)
    for call in (client.responses.retrieve, client.responses.delete, client.responses.cancel):
        with pytest.raises(openai.NotFoundError) as e:
            call(long.id)
        assert e.value.body["code"] == "response_not_found"
    assert kv_after_flush(server) == 0  # the cancelled run's KV was freed, and no request above left any


def test_a_stream_the_client_leaves_is_aborted(client, server):
    stream = create(client, input="Write a story.", stream=True, max_output_tokens=2000,
                    extra_body={"ignore_eos": True})
    seen = [next(stream).type for _ in range(5)]
    stream.close()
    assert seen[-1] == "response.output_text.delta"
    # 2000 tokens take far longer than this: the engine aborted the request when the stream closed
    assert kv_after_flush(server, timeout=15) == 0


def test_agents_sdk_runs_a_tool_then_a_structured_answer(server):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        calls.append(city)
        return f"Sunny and 21 C in {city}"

    class Report(BaseModel):
        city: str = Field(max_length=12)
        sunny: bool

    # the first turn must call the tool; the SDK then resets tool_choice and the answer is held to Report
    agent = agents.Agent(name="weather", instructions="You answer weather questions.", tools=[get_weather],
                         output_type=Report, model=agents.OpenAIResponsesModel(MODEL, openai_client=client),
                         model_settings=agents.ModelSettings(tool_choice="required", max_tokens=40, temperature=0))

    async def run() -> None:
        result = await agents.Runner.run(agent, ASK, max_turns=3)
        assert len(calls) == 1 and calls[0]
        assert [type(i).__name__ for i in result.new_items] == ["ToolCallItem", "ToolCallOutputItem",
                                                                "MessageOutputItem"]
        assert isinstance(result.final_output, Report) and result.final_output.city
        streamed = agents.Runner.run_streamed(agent, ASK, max_turns=3)
        kinds = [(e.type, e.data.type if e.type == "raw_response_event" else getattr(e, "name", None))
                 async for e in streamed.stream_events()]
        assert ("run_item_stream_event", "tool_output") in kinds and len(calls) == 2
        raw = [k for t, k in kinds if t == "raw_response_event"]
        assert raw.count("response.completed") == 2 and "response.function_call_arguments.delta" in raw
        assert "response.output_text.delta" in raw and streamed.final_output == result.final_output

    asyncio.run(run())
