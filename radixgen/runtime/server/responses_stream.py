"""Chat deltas in, a Response and its stream events out: `ResponseBuilder` turns the chat path's
deltas of one choice (content, reasoning_content, tool-call deltas, the finish reason) into output
items and the Responses API's SSE event sequence, each event numbered by `sequence_number`:

    response.created, response.in_progress,
    per output item, in the order the reply makes them:
      response.output_item.added
      message:        response.content_part.added, response.output_text.delta..., response.output_text.done,
                      response.content_part.done
      reasoning:      response.content_part.added, response.reasoning_text.delta...,
                      response.reasoning_text.done, response.content_part.done
      function call:  response.function_call_arguments.delta..., response.function_call_arguments.done
      response.output_item.done
    response.completed (or response.incomplete at max_output_tokens, response.failed on an error).

A non-streamed response feeds the builder the same deltas and keeps only its final Response, so both
ways answer alike. A tool call the parser revokes (malformed after it started; its raw text follows
as content) is closed as `incomplete` in the stream and left out of the final output, as chat's
folded message leaves it out.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from radixgen.runtime.server.protocol import APIError, ChatStreamChoice, Usage
from radixgen.runtime.server.responses_protocol import (
    IncompleteDetails,
    InputTokensDetails,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    OutputTokensDetails,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
)


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_usage(usage: Usage, reasoning_tokens: int = 0) -> ResponseUsage:
    """Chat usage as the Responses API reports it (cached tokens: the prompt's radix-cache hit)."""
    details = usage.prompt_tokens_details
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=details.cached_tokens if details else 0),
        output_tokens=usage.completion_tokens, output_tokens_details=OutputTokensDetails(
            reasoning_tokens=reasoning_tokens), total_tokens=usage.total_tokens)


def sse_event(event: dict[str, Any]) -> bytes:
    """One Responses SSE event: its type as the SSE event name, its JSON as the data."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


@dataclass
class _Open:
    """The output item being written, and its text so far."""

    index: int  # its output_index
    item: OutputItem
    text: str = ""
    call: int | None = None  # the chat tool-call index, for function calls


@dataclass
class ResponseBuilder:
    """Builds one response from chat deltas (see the module docstring). `response` starts as the
    in-progress snapshot the stream's first events carry."""

    response: ResponseObject
    revoked: set[int] = field(default_factory=set)  # the parser's (live) set of revoked tool-call indexes
    sequence: int = 0
    items: list[OutputItem] = field(default_factory=list)  # every item, revoked calls included
    calls: dict[int, int] = field(default_factory=dict)  # chat tool-call index -> output_index
    finish: str | None = None
    _open: _Open | None = None

    def _event(self, type: str, **fields: Any) -> dict[str, Any]:
        event = {"type": type, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _dump(self, model: Any) -> dict[str, Any]:
        return model.model_dump(mode="json")

    def start(self) -> list[dict[str, Any]]:
        """response.created and response.in_progress."""
        snapshot = self.response.wire()
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def feed(self, delta: ChatStreamChoice) -> list[dict[str, Any]]:
        """The events of one chat delta."""
        events: list[dict[str, Any]] = []
        d = delta.delta
        if d.reasoning_content:
            events += self._text("reasoning", d.reasoning_content)
        if d.content:
            events += self._text("message", d.content)
        for tc in d.tool_calls or []:
            fn = tc.function or {}
            if tc.id is not None:
                events += self._close()
                item = OutputFunctionCall(id=item_id("fc"), call_id=tc.id, name=fn["name"], arguments="",
                                          status="in_progress")
                events += self._add(item, call=tc.index)
            args = fn.get("arguments", "")
            if args and self._open is not None and self._open.call == tc.index:
                self._open.text += args
                events.append(self._event("response.function_call_arguments.delta", item_id=self._open.item.id,
                                          output_index=self._open.index, delta=args))
        if delta.finish_reason is not None:
            self.finish = delta.finish_reason
        return events

    def _add(self, item: OutputItem, call: int | None = None) -> list[dict[str, Any]]:
        self._open = _Open(len(self.items), item, call=call)
        if call is not None:
            self.calls[call] = self._open.index
        self.items.append(item)
        events = [self._event("response.output_item.added", output_index=self._open.index, item=self._dump(item))]
        if isinstance(item, (OutputMessage, OutputReasoning)):
            part = OutputText(text="") if isinstance(item, OutputMessage) else ReasoningText(text="")
            events.append(self._event("response.content_part.added", item_id=item.id, output_index=self._open.index,
                                      content_index=0, part=self._dump(part)))
        return events

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self._open.item.type != kind:
            events += self._close()
            item = OutputMessage(id=item_id("msg"), status="in_progress") if kind == "message" \
                else OutputReasoning(id=item_id("rs"), status="in_progress")
            events += self._add(item)
        assert self._open is not None
        self._open.text += text
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": []} if kind == "message" else {}
        events.append(self._event(name, item_id=self._open.item.id, output_index=self._open.index, content_index=0,
                                  delta=text, **extra))
        return events

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        """Finish the open item: its done events, its final state in `items`."""
        op, self._open = self._open, None
        if op is None:
            return []
        base = {"item_id": op.item.id, "output_index": op.index}
        events: list[dict[str, Any]] = []
        if isinstance(op.item, OutputFunctionCall):
            status = "incomplete" if op.call in self.revoked else status
            item: OutputItem = op.item.model_copy(update={"arguments": op.text, "status": status})
            events.append(self._event("response.function_call_arguments.done", arguments=op.text, **base))
        elif isinstance(op.item, OutputMessage):
            part = OutputText(text=op.text)
            item = op.item.model_copy(update={"content": [part], "status": status})
            events += [self._event("response.output_text.done", content_index=0, text=op.text, logprobs=[], **base),
                       self._event("response.content_part.done", content_index=0, part=self._dump(part), **base)]
        else:
            part = ReasoningText(text=op.text)
            item = op.item.model_copy(update={"content": [part], "status": status})
            events += [self._event("response.reasoning_text.done", content_index=0, text=op.text, **base),
                       self._event("response.content_part.done", content_index=0, part=self._dump(part), **base)]
        self.items[op.index] = item
        events.append(self._event("response.output_item.done", output_index=op.index, item=self._dump(item)))
        return events

    def close(self) -> list[dict[str, Any]]:
        """Close the last item (once the reply has ended); `reasoning_text` is then whole."""
        return self._close("incomplete" if self.finish == "length" else "completed")

    def reasoning_text(self) -> str:
        return "".join(c.text for it in self.items if isinstance(it, OutputReasoning) for c in it.content)

    def complete(self, usage: ResponseUsage) -> list[dict[str, Any]]:
        """After `close`: the final response (`response`) and the terminal event."""
        incomplete = self.finish == "length"
        dropped = {self.calls[c] for c in self.revoked if c in self.calls}
        self.response = self.response.model_copy(update=dict(
            status="incomplete" if incomplete else "completed", completed_at=int(time.time()), usage=usage,
            output=[it for i, it in enumerate(self.items) if i not in dropped],
            incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None))
        kind = "response.incomplete" if incomplete else "response.completed"
        return [self._event(kind, response=self.response.wire())]

    def fail(self, error: APIError) -> list[dict[str, Any]]:
        """End the reply on an engine error midway: the open item as incomplete, then response.failed."""
        events = self._close("incomplete")
        self.response = self.response.model_copy(update=dict(
            status="failed", output=list(self.items),
            error=ResponseError(code=error.code or "server_error", message=error.message)))
        return events + [self._event("response.failed", response=self.response.wire())]
