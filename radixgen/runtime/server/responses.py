"""OpenAI's Responses API over the chat completions path.

Routes: POST /v1/responses, GET /v1/responses/{id}, DELETE /v1/responses/{id},
POST /v1/responses/{id}/cancel.

A request is translated into the chat request it means (responses_input.py: the conversation of a
`previous_response_id` chain plus instructions and input items, tools, tool_choice, text.format as
response_format), planned and run by chat.py / serving.py exactly as a chat completion (same prompt,
so a chained turn hits the radix cache; same grammar constraint; same reasoning and tool-call
parsers), and the chat deltas are translated back into output items and the Responses SSE events
(responses_stream.py). Errors raised on the chat path are renamed to this API's fields.

- `store` (default true) keeps the response for GET, DELETE and chaining (responses_store.py: a
  bounded LRU, per API key); a streamed response is stored once it ends.
- `background: true` (needs `store`) answers at once with a `queued` response and runs it without a
  client attached; GET polls it, POST .../cancel aborts it (the engine frees its KV) and marks it
  `cancelled`. Input errors are still 400s on the POST itself, as the plan is made before answering.
  Streaming a background response is not supported (400).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixgen.runtime.server.auth import presented_key
from radixgen.runtime.server.chat import ChatOutput, plan_chat
from radixgen.runtime.server.protocol import APIError, Usage, bad_request
from radixgen.runtime.server.responses_input import chat_request, responses_error
from radixgen.runtime.server.responses_protocol import ResponseObject, ResponsesRequest
from radixgen.runtime.server.responses_store import ResponseStore, StoredResponse
from radixgen.runtime.server.responses_stream import ResponseBuilder, item_id, response_usage, sse_event
from radixgen.runtime.server.serving import Plan, Streamed, open_deltas, run
from radixgen.runtime.server.state import ServerState
from radixgen.runtime.server.streams import SSEResponse

T = TypeVar("T")
logger = logging.getLogger("radixgen.server")
UNFINISHED = ("queued", "in_progress")


def register(app: FastAPI, state: ServerState, keyed: bool) -> None:
    """Add the routes; `keyed`: the server has an API key, so stored responses are kept per key."""
    store = ResponseStore(state.options.max_stored_responses)

    def owner(request: Request) -> str:
        return owner_of(dict(request.scope["headers"]), keyed)

    @app.post("/v1/responses")
    async def create(req: ResponsesRequest, request: Request) -> Response:
        return await create_response(state, store, owner(request), req, request)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> Response:
        return JSONResponse(store.get(owner(request), response_id).response.wire())

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> Response:
        await _stop(store.pop(owner(request), response_id))
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str, request: Request) -> Response:
        entry = store.get(owner(request), response_id)
        if not entry.response.background:
            raise bad_request("Only a response created with background=true can be cancelled", "response_id")
        await _stop(entry)
        return JSONResponse(entry.response.wire())


def owner_of(headers: dict[bytes, bytes], keyed: bool) -> str:
    """Whose stored responses a request reads: the digest of the API key it presented (`keyed`: the
    server has keys; the gate has already checked it), else everyone's one namespace."""
    return hashlib.sha256(presented_key(headers)).hexdigest() if keyed else ""


async def _stop(entry: StoredResponse) -> None:
    """Cancel a background run (its engine request is aborted) and wait until it has ended."""
    if entry.task is not None and not entry.task.done():
        entry.task.cancel()
        await asyncio.wait({entry.task})
    if entry.response.status in UNFINISHED:
        entry.response = entry.response.model_copy(update={"status": "cancelled"})


async def _chat_path(aw: Awaitable[T]) -> T:
    """Await work on the chat path, its errors renamed to this API's fields."""
    try:
        return await aw
    except APIError as e:
        raise responses_error(e) from None


def _snapshot(state: ServerState, req: ResponsesRequest, status: str) -> ResponseObject:
    return ResponseObject(
        id=item_id("resp"), created_at=int(time.time()), status=status, background=req.background,
        instructions=req.instructions, max_output_tokens=req.max_output_tokens, metadata=req.metadata,
        model=state.model_name, parallel_tool_calls=req.parallel_tool_calls,
        previous_response_id=req.previous_response_id, reasoning=req.reasoning, store=req.store,
        temperature=req.temperature, text=req.text, tool_choice=req.tool_choice, tools=req.tools, top_p=req.top_p,
        truncation=req.truncation, user=req.user)


async def create_response(state: ServerState, store: ResponseStore, owner: str, req: ResponsesRequest,
                          request: Request) -> Response:
    """Answer a POST /v1/responses for `owner` (see the module docstring): the response as JSON, its
    events as SSE, or at once a queued background response. Bad input raises a 400 before any work."""
    if req.background and not req.store:
        raise bad_request("background responses are stored: background=true needs store=true", "background")
    if req.background and req.stream:
        raise bad_request("streaming a background response is not supported: poll it with GET", "stream")
    history = store.conversation(owner, req.previous_response_id) if req.previous_response_id else []
    chat_req = chat_request(req, history)
    plan, out = await _chat_path(plan_chat(state, chat_req))
    builder = ResponseBuilder(_snapshot(state, req, "queued" if req.background else "in_progress"),
                              out.parsers[0].revoked)
    entry = StoredResponse(builder.response, list(req.input))
    if req.background:
        entry.task = asyncio.ensure_future(_background(state, plan, out, builder, entry))
        store.put(owner, entry)
        return JSONResponse(entry.response.wire())
    if req.stream:
        items = await _chat_path(open_deltas(state, request, plan, out))
        return SSEResponse(_events(state, builder, items, store if req.store else None, owner, entry))
    deltas, _, usage = await _chat_path(run(state, request, plan, out))
    await _finish(state, builder, deltas[0], usage)
    entry.response = builder.response
    if req.store:
        store.put(owner, entry)
    return JSONResponse(builder.response.wire())


async def _finish(state: ServerState, builder: ResponseBuilder, deltas: list[Any], usage: Usage | None
                  ) -> list[dict[str, Any]]:
    """Feed the reply's last deltas, close it and complete the response; returns the events."""
    events = [e for d in deltas for e in builder.feed(d)] + builder.close()
    reasoning = builder.reasoning_text()
    tokens = len(await state.offload(state.tokenizer.encode, reasoning, False)) if reasoning else 0
    return events + builder.complete(response_usage(usage or Usage(), tokens))


async def _background(state: ServerState, plan: Plan, out: ChatOutput, builder: ResponseBuilder,
                      entry: StoredResponse) -> None:
    """Run a background response to its end, its entry updated as it goes (cancelling the task aborts it)."""
    entry.response = builder.response = builder.response.model_copy(update={"status": "in_progress"})
    try:
        deltas, _, usage = await _chat_path(run(state, None, plan, out))
        await _finish(state, builder, deltas[0], usage)
    except APIError as e:
        builder.fail(e)
    except Exception as e:  # a bug: the response fails, the server goes on
        logger.exception("background response %s failed", builder.response.id)
        builder.fail(APIError(500, f"internal error: {type(e).__name__}", "server_error", None, "server_error"))
    entry.response = builder.response


async def _events(state: ServerState, builder: ResponseBuilder, items: AsyncIterator[Streamed],
                  store: ResponseStore | None, owner: str, entry: StoredResponse) -> AsyncIterator[bytes]:
    """The SSE body: lifecycle events, each chat delta's events (one write per engine chunk), the end."""
    yield b"".join(map(sse_event, builder.start()))
    usage: Usage | None = None
    async with contextlib.aclosing(items):
        async for item in items:
            if isinstance(item, APIError):
                events = builder.fail(responses_error(item))
                break
            if isinstance(item, Usage):
                usage = item
                continue
            events = [e for d in item for e in builder.feed(d)]
            if events:
                yield b"".join(map(sse_event, events))
        else:
            events = await _finish(state, builder, [], usage)
    entry.response = builder.response
    if store is not None:
        store.put(owner, entry)
    yield b"".join(map(sse_event, events))
