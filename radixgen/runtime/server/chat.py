"""POST /v1/chat/completions: OpenAI chat completions over the engine, streamed or not.

The prompt, tools and output constraint come from chat_prompt.py; the reply of each choice goes
through its output parser (parsers/): the reasoning parser when the server has one
(`reasoning_content`, kept out of `content`), then the tool-call parser when the request has tools.

Streaming (SSE), as OpenAI's API does: a role chunk per choice, then deltas as they are generated:
`content`, `reasoning_content`, and tool calls, whose first delta carries `index`, `id`, `type` and
`function.name` and later ones `function.arguments` fragments; then a chunk with the finish reason
(`tool_calls` when the reply made calls), an optional usage chunk (`stream_options.include_usage`)
and `data: [DONE]`. Logprobs ride on the delta of the chunk whose tokens they score. Without
streaming, the same deltas are folded into one message per choice (serving.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from radixgen.runtime.server.chat_prompt import build_messages, choice_parsers, constraint, render, tool_setup
from radixgen.runtime.server.parsers import CallArgs, CallStart, ChoiceParser, Content, Event, Reasoning
from radixgen.runtime.server.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatLogprobToken,
    ChatLogprobTop,
    ChatResponseMessage,
    ChatStreamChoice,
    FunctionCall,
    ToolCall,
    ToolCallDelta,
    Usage,
    bad_request,
    new_id,
    now,
)
from radixgen.runtime.server.serving import Output, Plan, TokenLogprobs, expand, respond
from radixgen.runtime.server.state import ServerState


def register(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(state, req, request)


def _lp(x: Any) -> float:
    return -9999.0 if x is None else max(float(x), -9999.0)


def chat_logprobs(state: ServerState, entries: list, tops: list | None) -> ChatLogprobs:
    """OpenAI's chat logprobs of tokens given as (logprob, id), with their top (logprob, id) lists."""
    content = []
    for j, (lp, tid) in enumerate(entries):
        text, raw = state.piece(tid)
        top = []
        for tlp, ttid in (tops[j] or []) if tops is not None and j < len(tops) else []:
            ttext, traw = state.piece(ttid)
            top.append(ChatLogprobTop(token=ttext, logprob=_lp(tlp), bytes=traw))
        content.append(ChatLogprobToken(token=text, logprob=_lp(lp), bytes=raw, top_logprobs=top))
    return ChatLogprobs(content=content)


def finish_reason(fr: dict | None) -> str | None:
    return None if fr is None else ("length" if fr["type"] == "length" else "stop")


def _delta(ev: Event) -> ChatDelta | None:
    if isinstance(ev, Content):
        return ChatDelta(content=ev.text)
    if isinstance(ev, Reasoning):
        return ChatDelta(reasoning_content=ev.text)
    if isinstance(ev, CallStart):
        return ChatDelta(tool_calls=[ToolCallDelta(index=ev.index, id=ev.id, type="function",
                                                   function={"name": ev.name, "arguments": ""})])
    if isinstance(ev, CallArgs):
        return ChatDelta(tool_calls=[ToolCallDelta(index=ev.index, function={"arguments": ev.text})])
    return None  # CallRevoked: the call's text follows as content


class ChatOutput(Output):
    """Engine chunks of each choice -> chat deltas (through its parser) -> chunks or one response."""

    def __init__(self, state: ServerState, parsers: list[ChoiceParser], logprobs: bool) -> None:
        self.state, self.parsers, self.logprobs = state, parsers, logprobs
        self.id, self.created, self.model = new_id("chatcmpl"), now(), state.model_name

    def opening(self, index: int) -> list[ChatStreamChoice]:
        return [ChatStreamChoice(index=index, delta=ChatDelta(role="assistant", content=""))]

    def step(self, index: int, chunk: dict, logprobs: TokenLogprobs | None) -> list[ChatStreamChoice]:
        parser = self.parsers[index]
        fr = chunk["meta_info"]["finish_reason"]
        events = parser.feed(chunk["text"]) if chunk["text"] else []
        if fr is not None:
            events += parser.finish()
        deltas = [d for d in map(_delta, events) if d is not None]
        out = [ChatStreamChoice(index=index, delta=d) for d in deltas]
        if logprobs is not None and logprobs.entries:
            if not out:
                out.append(ChatStreamChoice(index=index, delta=ChatDelta()))
            out[0].logprobs = chat_logprobs(self.state, logprobs.entries, logprobs.tops)
        if fr is not None:
            calls = parser.tools is not None and parser.tools.calls > len(parser.revoked)
            out.append(ChatStreamChoice(index=index, delta=ChatDelta(),
                                        finish_reason="tool_calls" if calls else finish_reason(fr)))
        return out

    def chunk(self, deltas: list[ChatStreamChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=deltas, usage=usage)

    def response(self, deltas: list[list[ChatStreamChoice]], metas: list[dict], usage: Usage
                 ) -> ChatCompletionResponse:
        choices = [self._fold(i, ds, metas[i]) for i, ds in enumerate(deltas)]
        return ChatCompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices,
                                      usage=usage)

    def _fold(self, index: int, deltas: list[ChatStreamChoice], meta: dict) -> ChatChoice:
        content, reasoning, tokens, finish = [], [], [], None
        calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        for d in deltas:
            content.append(d.delta.content or "")
            reasoning.append(d.delta.reasoning_content or "")
            for tc in d.delta.tool_calls or []:
                if tc.id is not None:
                    calls[tc.index] = [tc.id, (tc.function or {})["name"], ""]
                calls[tc.index][2] += (tc.function or {}).get("arguments", "")
            if d.logprobs is not None:
                tokens += d.logprobs.content or []
            finish = d.finish_reason or finish
        revoked = self.parsers[index].revoked
        tool_calls = [ToolCall(id=c[0], function=FunctionCall(name=c[1], arguments=c[2]))
                      for k, c in sorted(calls.items()) if k not in revoked]
        text = "".join(content)
        message = ChatResponseMessage(content=text if text or not tool_calls else None,
                                      reasoning_content="".join(reasoning) or None, tool_calls=tool_calls or None)
        fr = meta["finish_reason"]
        return ChatChoice(index=index, message=message, finish_reason=finish,
                          logprobs=ChatLogprobs(content=tokens) if self.logprobs else None,
                          matched_stop=fr.get("matched") if fr else None)


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, request: Request) -> Response:
    plan, out = await plan_chat(state, req)
    return await respond(state, request, plan, out)


async def plan_chat(state: ServerState, req: ChatCompletionRequest) -> tuple[Plan, ChatOutput]:
    """The engine work of a chat request (its prompt, sampling params and constraint) and the output
    that turns its engine chunks into chat deltas; bad input raises a 400 APIError. The Responses
    endpoint (responses.py) runs its requests through this too."""
    state.check_model(req.model)
    tools = tool_setup(state, req)
    messages, tool_specs = build_messages(state, req, tools)
    # templating, tokenizing and schema checks run off the event loop (state.offload)
    prompt = await state.offload(render, state, messages, tool_specs, req.chat_template_kwargs)
    ids = await state.offload(lambda: state.tokenize(prompt, "messages", add_special_tokens=False))
    state.check_context(ids)
    reasoning = (state.reasoning, state.reasoning.phase_of(prompt)) if state.reasoning is not None else None
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sp = await state.offload(lambda: req.sampling_params(max_tokens, default_max_tokens=state.room(ids, req.n)))
    extra, cparam = await state.offload(constraint, state, req, sp, tools, reasoning)
    sp.update(extra)
    if req.skip_special_tokens is None and tools.marked_by_special_tokens(state.tokenizer):
        sp["skip_special_tokens"] = False  # the parser must see the format's markers in the text
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    top = req.top_logprobs or 0
    if not 0 <= top <= 20:
        raise bad_request(f"top_logprobs must be in [0, 20], got {top}", "top_logprobs")
    plan = Plan(expand([ids], sp, req.n), dict(return_logprob=req.logprobs, top_logprobs_num=top), cparam,
                req.stream, bool(req.stream_options and req.stream_options.include_usage))
    return plan, ChatOutput(state, choice_parsers(state, tools, reasoning, req.n), req.logprobs)
