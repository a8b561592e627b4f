"""ResponseBuilder (server/responses_stream.py): chat deltas in, the Responses API's output items and SSE
event sequence out, checked without a model. The event order is the one OpenAI documents (and the
`openai` client's stream accumulator enforces, which the e2e tests run); here the cases a small model
cannot be made to produce on demand: reasoning before the answer, text and two calls in one reply, a
call the parser revoked, and an engine error midway."""

from __future__ import annotations

from itertools import groupby

from radixgen.runtime.server.protocol import APIError, ChatDelta, ChatStreamChoice, ToolCallDelta, Usage
from radixgen.runtime.server.responses_protocol import ResponseObject, ResponsesRequest
from radixgen.runtime.server.responses_stream import ResponseBuilder, response_usage


def builder(revoked: set[int] | None = None) -> ResponseBuilder:
    req = ResponsesRequest(input="hi")
    snapshot = ResponseObject(
        id="resp_1", created_at=0, status="in_progress", background=False, instructions=None, max_output_tokens=None,
        metadata=None, model="m", parallel_tool_calls=True, previous_response_id=None, reasoning=None, store=True,
        temperature=None, text=req.text, tool_choice="auto", tools=[], top_p=None, truncation="disabled", user=None)
    return ResponseBuilder(snapshot, revoked if revoked is not None else set())


def d(content: str | None = None, reasoning: str | None = None, calls: list[ToolCallDelta] | None = None,
      finish: str | None = None) -> ChatStreamChoice:
    return ChatStreamChoice(index=0, delta=ChatDelta(content=content, reasoning_content=reasoning, tool_calls=calls),
                            finish_reason=finish)


def start(i: int, name: str) -> ToolCallDelta:
    return ToolCallDelta(index=i, id=f"call_{i}", type="function", function={"name": name, "arguments": ""})


def args(i: int, text: str) -> ToolCallDelta:
    return ToolCallDelta(index=i, function={"arguments": text})


def run(b: ResponseBuilder, deltas: list[ChatStreamChoice], usage: Usage | None = None) -> list[dict]:
    events = b.start()
    for x in deltas:
        events += b.feed(x)
    events += b.close()
    return events + b.complete(response_usage(usage or Usage.of(5, 4, 2), 3))


def kinds(events: list[dict]) -> list[str]:
    return [k for k, _ in groupby(e["type"] for e in events)]  # runs of one type counted once


def test_reasoning_then_answer():
    b = builder()
    events = run(b, [d(content=""), d(reasoning="let me "), d(reasoning="think"), d(content="Blue"),
                     d(content=" sky", finish="stop")])
    assert kinds(events) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    reasoning, message = b.response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "let me think"
    assert message.type == "message" and message.content[0].text == "Blue sky" and message.status == "completed"
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in done] == [0, 1] and done[1]["item"]["id"] == message.id
    assert all(e["item_id"] == message.id for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["input_tokens_details"]["cached_tokens"] == 2
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 3 and final["usage"]["total_tokens"] == 9
    assert b.reasoning_text() == "let me think"


def test_text_and_two_calls_in_one_reply():
    b = builder()
    events = run(b, [d(content="Sure."), d(calls=[start(0, "f")]), d(calls=[args(0, '{"a":')]),
                     d(calls=[args(0, " 1}")]), d(calls=[start(1, "g"), args(1, "{}")]), d(finish="tool_calls")])
    msg, f, g = b.response.output
    assert msg.content[0].text == "Sure."
    assert (f.name, f.arguments, f.call_id, f.status) == ("f", '{"a": 1}', "call_0", "completed")
    assert (g.name, g.arguments) == ("g", "{}") and f.id != g.id
    arg_done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["output_index"], e["arguments"]) for e in arg_done] == [(1, '{"a": 1}'), (2, "{}")]


def test_a_revoked_call_closes_incomplete_and_leaves_the_output():
    revoked: set[int] = set()
    b = builder(revoked)
    events = b.start() + b.feed(d(calls=[start(0, "f"), args(0, '{"a": ')]))
    revoked.add(0)  # the parser finds the call broken; its text follows as content
    events += b.feed(d(content='<tool_call>{"name": "f", "arguments": {"a": ', finish="stop"))
    events += b.close() + b.complete(response_usage(Usage.of(1, 1, 0)))
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["type"], i["status"]) for i in done] == [("function_call", "incomplete"), ("message", "completed")]
    assert [o.type for o in b.response.output] == ["message"]


def test_length_finish_is_incomplete():
    b = builder()
    events = run(b, [d(content="1, 2, 3", finish="length")])
    assert events[-1]["type"] == "response.incomplete"
    assert b.response.status == "incomplete" and b.response.incomplete_details.reason == "max_output_tokens"
    assert b.response.output[0].status == "incomplete"


def test_an_error_midway_fails_the_response():
    b = builder()
    events = b.start() + b.feed(d(content="Once upon"))
    events += b.fail(APIError(500, "the engine stopped", "server_error", None, "aborted"))
    assert [e["type"] for e in events[-2:]] == ["response.output_item.done", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": "aborted", "message": "the engine stopped"}
    assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["content"][0]["text"] == "Once upon"
