"""The stored responses of /v1/responses (server/responses_store.py) and the translation of a chained
conversation into chat messages (server/responses_input.py), without a model: LRU eviction that spares
running background work, one namespace per API key, chains walked link by link."""

from __future__ import annotations

import asyncio

import pytest

from radixgen.runtime.server.protocol import APIError
from radixgen.runtime.server.responses import owner_of
from radixgen.runtime.server.responses_input import chat_messages, chat_request
from radixgen.runtime.server.responses_protocol import (
    MessageItem,
    OutputFunctionCall,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
)
from radixgen.runtime.server.responses_store import ResponseStore, StoredResponse


def entry(rid: str, text: str = "", previous: str | None = None, status: str = "completed",
          said: str = "hi") -> StoredResponse:
    req = ResponsesRequest(input=said)
    out = [OutputMessage(id=f"msg_{rid}", status="completed", content=[OutputText(text=text)])] if text else []
    response = ResponseObject(
        id=rid, created_at=0, status=status, background=False, instructions=None, max_output_tokens=None,
        metadata=None, model="m", output=out, parallel_tool_calls=True, previous_response_id=previous, reasoning=None,
        store=True, temperature=None, text=req.text, tool_choice="auto", tools=[], top_p=None, truncation="disabled",
        user=None)
    return StoredResponse(response, list(req.input))


def test_least_recently_used_goes_first_but_never_running_work():
    store = ResponseStore(2)
    store.put("", entry("a"))
    store.put("", entry("b"))
    store.get("", "a")  # a is now more recent than b
    store.put("", entry("c"))
    with pytest.raises(APIError) as e:
        store.get("", "b")
    assert e.value.status == 404 and e.value.code == "response_not_found"
    assert store.get("", "a") and store.get("", "c")

    async def running() -> None:
        task = asyncio.ensure_future(asyncio.sleep(10))
        busy = entry("busy", status="in_progress")
        busy.task = task
        store.put("", busy)
        store.put("", entry("d"))  # over the bound: the idle ones go, the running one stays
        assert store.get("", "busy") is busy and store.get("", "d") and len(store) == 2
        task.cancel()

    asyncio.run(running())


def test_owners_do_not_see_each_other():
    alice, bob = (owner_of({b"authorization": f"Bearer {k}".encode()}, keyed=True) for k in ("ka", "kb"))
    assert alice != bob and owner_of({b"x-api-key": b"ka"}, keyed=True) == alice
    assert owner_of({b"authorization": b"Bearer ka"}, keyed=False) == ""
    store = ResponseStore(8)
    store.put(alice, entry("r"))
    assert store.get(alice, "r")
    with pytest.raises(APIError):
        store.get(bob, "r")
    with pytest.raises(APIError):
        store.pop(bob, "r")


def test_a_chain_is_its_turns_in_order():
    store = ResponseStore(8)
    store.put("", entry("r1", "Apple.", said="A fruit?"))
    store.put("", entry("r2", "Pear.", previous="r1", said="Another?"))
    items = store.conversation("", "r2")
    msgs = [(m.role, m.content) for m in chat_messages(items, "previous_response_id")]
    assert msgs == [("user", "A fruit?"), ("assistant", "Apple."), ("user", "Another?"), ("assistant", "Pear.")]
    store.put("", entry("r3", previous="r2", status="in_progress"))
    with pytest.raises(APIError) as e:
        store.conversation("", "r3")
    assert e.value.status == 400 and e.value.param == "previous_response_id"
    store.pop("", "r1")
    with pytest.raises(APIError) as e:
        store.conversation("", "r2")
    assert e.value.status == 404 and "r1" in e.value.message


def test_items_become_the_chat_messages_a_chat_client_sends():
    call = OutputFunctionCall(id="fc_1", call_id="call_1", name="f", arguments='{"a": 1}', status="completed")
    req = ResponsesRequest.model_validate({"instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "Do "}, {"type": "input_text", "text": "it"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Calling."}]},
        call.model_dump(), {"type": "function_call_output", "call_id": "call_1", "output": "done"},
        {"type": "reasoning", "id": "rs_1", "summary": []}]})
    chat = chat_request(req, [MessageItem(role="user", content="Earlier")])
    assert [(m.role, m.content) for m in chat.messages] == [
        ("system", "Be brief."), ("user", "Earlier"), ("developer", "Use tools."), ("user", "Do it"),
        ("assistant", "Calling."), ("tool", "done")]
    calls = chat.messages[4].tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [("call_1", "f", '{"a": 1}')]
    assert chat.messages[5].tool_call_id == "call_1" and chat.tool_choice is None


def test_a_forced_call_is_not_held_to_the_text_format():
    schema = {"type": "object"}
    body = {"input": "x", "tools": [{"type": "function", "name": "f"}],
            "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}}
    assert chat_request(ResponsesRequest.model_validate(body), []).response_format.json_schema.schema_ == schema
    forced = ResponsesRequest.model_validate(dict(body, tool_choice="required"))
    assert chat_request(forced, []).response_format is None


def test_extensions_and_sampling_fields_pass_on_to_chat():
    req = ResponsesRequest.model_validate({"input": "x", "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                                           "seed": 3, "regex": "a+",
                                           "chat_template_kwargs": {"enable_thinking": False}})
    chat = chat_request(req, [])
    assert (chat.max_completion_tokens, chat.temperature, chat.top_p, chat.seed) == (7, 0.5, 0.9, 3)
    assert chat.regex == "a+" and chat.chat_template_kwargs == {"enable_thinking": False}
