"""OpenAI serving the way clients consume it: the official `openai` client (and its helpers) against
the real `radixgen serve` (SmolLM2), greedy and short. Tool calls stream as OpenAI streams them (the
first delta of a call names it, later ones carry argument fragments) and fold into exactly what the
non-streamed reply holds; `parse()` / `stream()` validate against pydantic models; streamed n > 1,
logprobs and the usage chunk agree with the non-streamed answer."""

from __future__ import annotations

import json

import pytest
from tool_defs import TIME, WEATHER

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")

MODEL = "smollm2-135m-instruct"
TOOLS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What's the weather in Paris and the time in Tokyo?"}]


def chat(client, **kw):
    kw = {"model": MODEL, "messages": ASK, "max_tokens": 80, "temperature": 0, **kw}
    return client.chat.completions.create(**kw)


def streamed_calls(chunks) -> tuple[list[tuple[str, str, str]], int]:
    """([(id, name, arguments)] folded from the tool-call deltas, number of argument fragments),
    checking OpenAI's shape: a call's first delta has index, id, type and name; later ones only
    argument fragments."""
    calls: dict[int, list[str]] = {}
    fragments = 0
    for ch in chunks:
        for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            if d.index not in calls:
                assert d.id and d.id.startswith("call_") and d.type == "function" and d.function.name
                calls[d.index] = [d.id, d.function.name, d.function.arguments or ""]
            else:
                assert d.id is None and d.type is None and d.function.name is None and d.function.arguments
                calls[d.index][2] += d.function.arguments
                fragments += 1
    assert sorted(calls) == list(range(len(calls)))
    return [tuple(calls[i]) for i in sorted(calls)], fragments


def check_stream_matches(full, chunks) -> None:
    """The streamed tool calls fold into the non-streamed ones; arguments arrive in fragments."""
    calls, fragments = streamed_calls(chunks)
    want = [(c.function.name, c.function.arguments) for c in full.choices[0].message.tool_calls]
    assert [(n, a) for _, n, a in calls] == want
    assert fragments >= len(want)  # after the naming delta, each call's arguments came in pieces
    for name, args in want:
        jsonschema.validate(json.loads(args), TOOLS[name]["function"]["parameters"])
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["tool_calls"] == [full.choices[0].finish_reason]
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


@pytest.mark.parametrize("choice", ["required", "named"])
def test_grammar_enforced_tool_calls_stream_in_fragments(client, choice):
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "get_time"}}
    full = chat(client, tools=[WEATHER, TIME], tool_choice=tool_choice)
    assert full.choices[0].message.content is None and full.choices[0].message.tool_calls
    if choice == "named":
        assert [c.function.name for c in full.choices[0].message.tool_calls] == ["get_time"]
    check_stream_matches(full, list(chat(client, tools=[WEATHER, TIME], tool_choice=tool_choice, stream=True)))


# The model's free-format reply, pinned down by a regex extension so the test does not depend on
# what the model would choose: two calls in one turn, in the SmolLM2 format the server described.
TWO_CALLS = ('<tool_call>[{"name": "get_weather", "arguments": {"city": "(Paris|Rome)", '
             '"unit": "(celsius|fahrenheit)"}}, {"name": "get_time", "arguments": {"tz": "(Asia/Tokyo|Europe/Paris)"}}]'
             '</tool_call>')
TWO_CALLS_REGEX = TWO_CALLS.replace("[", r"\[").replace("]", r"\]").replace("{", r"\{").replace("}", r"\}")


def test_two_parallel_free_format_calls_stream_and_fold_alike(client):
    body = {"regex": TWO_CALLS_REGEX}
    full = chat(client, tools=[WEATHER, TIME], extra_body=body)
    calls = full.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"] and len({c.id for c in calls}) == 2
    check_stream_matches(full, list(chat(client, tools=[WEATHER, TIME], extra_body=body, stream=True)))
    # with parallel_tool_calls=false only the first call is kept
    one = chat(client, tools=[WEATHER, TIME], extra_body=body, parallel_tool_calls=False)
    assert [c.function.arguments for c in one.choices[0].message.tool_calls] == [calls[0].function.arguments]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    age: int = pydantic.Field(ge=0, le=120)


class GetWeather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=16)


PERSON = [{"role": "user", "content": "Invent a person. Reply as JSON."}]


def test_parse_returns_validated_pydantic_objects(client):
    out = client.chat.completions.parse(model=MODEL, messages=PERSON, response_format=Person, temperature=0,
                                        max_tokens=60)
    msg = out.choices[0].message
    assert isinstance(msg.parsed, Person) and msg.parsed == Person.model_validate_json(msg.content)
    tool = openai.pydantic_function_tool(GetWeather)
    out = client.chat.completions.parse(model=MODEL, messages=ASK, tools=[tool], tool_choice="required",
                                        temperature=0, max_tokens=60)
    calls = out.choices[0].message.tool_calls
    assert calls and all(isinstance(c.function.parsed_arguments, GetWeather) for c in calls)


def test_stream_helper_events(client):
    with client.beta.chat.completions.stream(model=MODEL, messages=PERSON, response_format=Person, temperature=0,
                                             max_tokens=60) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    deltas = [e.delta for e in events if e.type == "content.delta"]
    (done,) = [e for e in events if e.type == "content.done"]
    assert len(deltas) > 1 and "".join(deltas) == done.content == final.choices[0].message.content
    assert isinstance(done.parsed, Person) and final.choices[0].message.parsed == done.parsed
    tool = openai.pydantic_function_tool(GetWeather)
    with client.beta.chat.completions.stream(model=MODEL, messages=ASK, tools=[tool], tool_choice="required",
                                             temperature=0, max_tokens=60) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    args = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
    dones = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    calls = final.choices[0].message.tool_calls
    assert len(args) > len(dones) == len(calls) >= 1
    assert [d.arguments for d in dones] == [c.function.arguments for c in calls]
    assert all(isinstance(d.parsed_arguments, GetWeather) for d in dones)


def test_streamed_n_logprobs_usage_and_accepted_fields(client):
    kw = dict(messages=[{"role": "user", "content": "Name a color."}], n=2, logprobs=True, top_logprobs=2,
              max_completion_tokens=6, seed=7, user="tester", metadata={"suite": "e2e"})
    full = chat(client, **kw)
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}, **kw))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == full.usage.completion_tokens
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    assert all(ch.usage is None for ch in body)
    for i, choice in enumerate(full.choices):
        mine = [ch.choices[0] for ch in body if ch.choices[0].index == i]
        text = "".join(c.delta.content or "" for c in mine)
        tokens = [t for c in mine if c.logprobs for t in c.logprobs.content]
        assert text == choice.message.content == "".join(t.token for t in tokens)
        assert [(t.token, t.logprob) for t in tokens] == [(t.token, t.logprob) for t in choice.logprobs.content]
        assert all(len(t.top_logprobs) == 2 for t in tokens)
        assert [c.finish_reason for c in mine if c.finish_reason] == [choice.finish_reason]
