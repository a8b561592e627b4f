"""POST /v1/chat/completions: OpenAI chat completions over the engine, streamed or not.

- The prompt is the model's chat template applied to the messages (text content or text parts;
  `developer` is treated as `system`), tokenized once here so its length is checked against the
  context length before anything runs.
- `response_format`: text; json_object -> the JSON schema `{"type": "object"}`; json_schema {name,
  schema, strict} -> that schema (checked here; strict rejects keywords the grammar cannot enforce).
  The radixgen extensions `regex`, `ebnf`, `json_schema` in the body constrain the output as well.
- Tools: they are rendered by the chat template when it takes `tools=`, otherwise described in the
  system prompt. tool_choice "none" leaves them out; "required" constrains the output to a JSON
  array of `{"name", "arguments"}` calls (a single call with parallel_tool_calls=false), a named
  function to one call of it; "auto" parses a JSON call out of free text when there is one.
  Parsed calls come back as `tool_calls` with `finish_reason: "tool_calls"`.
- Streaming (SSE): a role chunk per choice, content deltas, a chunk with the finish reason, an
  optional usage chunk (`stream_options.include_usage`), then `data: [DONE]`. Tool calls (and text
  that may turn out to be one in "auto" mode) are held back and sent as one `tool_calls` delta.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixgen.runtime.server.app import SSE_DONE, ServerState, SSEResponse, abort_error, merge_streams, sse
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
    NamedToolChoice,
    ToolCall,
    ToolCallDelta,
    Usage,
    bad_request,
    checked_constraint,
    new_id,
    now,
)

TOOLS_SYSTEM = (
    "You can call the following functions. To call one, reply with only a JSON object "
    '{{"name": <function name>, "arguments": <an object of its arguments>}}{plural}.\n\nFunctions:\n{specs}'
)
TOOL_CALL_PREFIXES = ("{", "[", "<tool_call>", "```")


def register(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(state, req, request)


# ---------------------------------------------------------------------------------------------- request


def tool_mode(req: ChatCompletionRequest) -> tuple[str, list[str]]:
    """("none" | "auto" | "required" | "named", the tool names the output may call)."""
    names = [t.function.name for t in req.tools or []]
    choice = req.tool_choice
    if choice is None:
        return ("auto" if names else "none"), names
    if not names and choice != "none":
        raise bad_request("tool_choice needs `tools`", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise bad_request(f"tool_choice names {choice.function.name!r}, which is not in tools {names}",
                              "tool_choice")
        return "named", [choice.function.name]
    return choice, names


def _tool_specs(req: ChatCompletionRequest) -> list[dict]:
    return [t.model_dump(exclude_none=True, by_alias=True) for t in req.tools or []]


def _call_schema(tool: Any) -> dict:
    params = tool.function.parameters or {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": tool.function.name}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_schema(req: ChatCompletionRequest, mode: str, names: list[str]) -> dict | None:
    """The JSON schema a required / named tool choice constrains the output to."""
    if mode not in ("required", "named"):
        return None
    calls = [_call_schema(t) for t in req.tools or [] if t.function.name in names]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if mode == "required" and req.parallel_tool_calls:
        return {"type": "array", "items": one, "minItems": 1}
    return one


def constraint(req: ChatCompletionRequest, sp: dict, mode: str, names: list[str]
               ) -> tuple[dict[str, str], str | None]:
    """The checked constraint param (json_schema / regex / ebnf) of this request: a tool choice,
    `response_format`, or one of the body extensions (already checked into `sp`); at most one.
    Returns (sampling params to set, the request field it came from)."""
    wanted: list[tuple[str, Any]] = []  # (param, json schema)
    schema = tool_schema(req, mode, names)
    if schema is not None:
        wanted.append(("tools", schema))
    rf = req.response_format
    if rf is not None and rf.type != "text":
        if rf.type == "json_object" or rf.json_schema is None or rf.json_schema.schema_ is None:
            wanted.append(("response_format", {"type": "object"}))
        else:
            wanted.append(("response_format", rf.json_schema.schema_))
    extension = [k for k in ("json_schema", "regex", "ebnf") if k in sp]
    if len(wanted) + len(extension) > 1:
        given = [w[0] for w in wanted] + extension
        raise bad_request(f"only one output constraint may be set, got {', '.join(given)}", given[1])
    if not wanted:
        return {k: sp[k] for k in extension}, (extension[0] if extension else None)
    param, value = wanted[0]
    if param == "tools":
        strict = any(t.function.strict for t in req.tools or [] if t.function.name in names)
    else:
        strict = bool(rf is not None and rf.json_schema and rf.json_schema.strict)
    return checked_constraint(param, "json_schema", value, strict=strict), param


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def build_messages(state: ServerState, req: ChatCompletionRequest, mode: str) -> tuple[list[dict], list | None]:
    """Message dicts for the template, and the `tools=` to pass it (None when described in text)."""
    native = mode != "none" and state.template_uses_tools()
    out: list[dict] = []
    for m in req.messages:
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.role == "assistant" and m.tool_calls:
            calls = [{"name": c.function.name, "arguments": _arguments(c.function.arguments)} for c in m.tool_calls]
            if native:
                d["tool_calls"] = [{"id": c.id, "type": "function", "function": call}
                                   for c, call in zip(m.tool_calls, calls, strict=True)]
            elif not d["content"]:
                d["content"] = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
        if m.role == "tool":
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
        out.append(d)
    if mode == "none" or not req.tools:
        return out, None
    if native:
        return out, _tool_specs(req)
    specs = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in _tool_specs(req))
    plural = " (or a JSON list of such objects to call several)" if mode != "named" and req.parallel_tool_calls \
        else ""
    text = TOOLS_SYSTEM.format(plural=plural, specs=specs)
    if out and out[0]["role"] == "system":
        out[0] = dict(out[0], content=f"{out[0]['content']}\n\n{text}" if out[0]["content"] else text)
    else:
        out.insert(0, {"role": "system", "content": text})
    return out, None


def render(state: ServerState, messages: list[dict], tools: list | None) -> str:
    try:
        if tools is not None:
            return state.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
        return state.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except ValueError as e:
        raise bad_request(str(e), "messages") from None
    except Exception as e:  # a template's raise_exception (e.g. roles must alternate)
        raise bad_request(f"the chat template rejected these messages: {e}", "messages") from None


# ---------------------------------------------------------------------------------------------- output


def parse_tool_calls(text: str, names: list[str]) -> list[ToolCall] | None:
    """Tool calls in `text` (a JSON object / list of `{"name", "arguments"}`, maybe in tags or
    fences), or None when it holds none for these tool names."""
    s = text.strip().replace("<tool_call>", "").replace("</tool_call>", "").strip()
    if s.startswith("```"):
        s = s.strip("`").removeprefix("json").strip()
    candidates = [s]
    for open_, close in (("[", "]"), ("{", "}")):
        i, j = s.find(open_), s.rfind(close)
        if 0 <= i < j:
            candidates.append(s[i:j + 1])
    for cand in candidates:
        try:
            obj = json.loads(cand)
        except ValueError:
            continue
        calls = obj if isinstance(obj, list) else [obj]
        out = []
        for c in calls:
            if not isinstance(c, dict) or c.get("name") not in names:
                break
            args = c.get("arguments", c.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    break
            out.append(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}",
                                function=FunctionCall(name=c["name"], arguments=json.dumps(args, ensure_ascii=False))))
        else:
            if out:
                return out
    return None


def _lp(x: Any) -> float:
    return -9999.0 if x is None else max(float(x), -9999.0)


def chat_logprobs(state: ServerState, entries: list, tops: list | None) -> ChatLogprobs:
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


# ---------------------------------------------------------------------------------------------- handler


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, request: Request) -> Response:
    state.check_model(req.model)
    mode, names = tool_mode(req)
    messages, tools = build_messages(state, req, mode)
    # templating, tokenizing and schema checks run off the event loop (state.offload)
    ids = await state.offload(lambda: state.tokenize(render(state, messages, tools), "messages",
                                                     add_special_tokens=False))
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sp = await state.offload(req.sampling_params, max_tokens, state.room(ids, req.n))
    extra, cparam = await state.offload(constraint, req, sp, mode, names)
    sp.update(extra)
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    top = req.top_logprobs or 0
    if not 0 <= top <= 20:
        raise bad_request(f"top_logprobs must be in [0, 20], got {top}", "top_logprobs")
    kw = dict(input_ids=ids, return_logprob=req.logprobs, top_logprobs_num=top)
    if req.stream:
        return await _stream(state, req, request, sp, dict(kw, constraint_param=cparam), mode, names)
    out = await state.generate(request, constraint_param=cparam, sampling_params=dict(sp, n=req.n), **kw)
    outs = out if isinstance(out, list) else [out]
    choices = []
    for i, o in enumerate(outs):
        meta = o["meta_info"]
        fr = meta["finish_reason"]
        calls = parse_tool_calls(o["text"], names) if mode != "none" else None
        msg = ChatResponseMessage(content=None if calls else o["text"], tool_calls=calls)
        logprobs = None
        if req.logprobs:
            logprobs = chat_logprobs(state, meta.get("output_token_logprobs", []), meta.get("output_top_logprobs"))
        choices.append(ChatChoice(index=i, message=msg, logprobs=logprobs,
                                  finish_reason="tool_calls" if calls else finish_reason(fr),
                                  matched_stop=fr.get("matched") if fr else None))
    metas = [o["meta_info"] for o in outs]
    usage = Usage.of(metas[0]["prompt_tokens"], sum(m["completion_tokens"] for m in metas),
                     min(m["cached_tokens"] for m in metas))
    resp = ChatCompletionResponse(id=new_id("chatcmpl"), created=now(), model=state.model_name, choices=choices,
                                  usage=usage)
    return JSONResponse(resp.model_dump(exclude_none=True))


def _seeded(sp: dict, k: int, n: int) -> dict:
    return dict(sp, seed=sp["seed"] + k) if n > 1 and sp.get("seed") is not None else sp


async def _stream(state: ServerState, req: ChatCompletionRequest, request: Request, sp: dict, kw: dict,
                  mode: str, names: list[str]) -> Response:
    n = req.n
    cparam = kw.pop("constraint_param")
    if n > 1:
        await state.precache(kw["input_ids"])
    streams = await state.open_streams(request, [dict(kw, sampling_params=_seeded(sp, k, n)) for k in range(n)],
                                       cparam)
    cid, created, model = new_id("chatcmpl"), now(), state.model_name
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def chunk(i: int, delta: ChatDelta, finish: str | None = None, logprobs: ChatLogprobs | None = None) -> bytes:
        return sse(ChatCompletionChunk(id=cid, created=created, model=model, choices=[
            ChatStreamChoice(index=i, delta=delta, logprobs=logprobs, finish_reason=finish)]))

    async def events() -> AsyncIterator[bytes]:
        held = ["" for _ in range(n)]  # text held back while it may be a tool call
        holding = [mode in ("required", "named", "auto") for _ in range(n)]
        seen = [0] * n  # output tokens seen per choice (to slice logprobs)
        metas: list[dict | None] = [None] * n
        for i in range(n):
            yield chunk(i, ChatDelta(role="assistant", content=""))
        async for i, c in merge_streams(streams):
            meta = c["meta_info"]
            fr = meta["finish_reason"]
            if fr is not None and fr["type"] == "abort":
                yield sse(abort_error(fr).body())
                return
            new = len(c["output_ids"])
            logprobs = None
            if req.logprobs and new:
                tops = meta.get("output_top_logprobs")
                logprobs = chat_logprobs(state, meta["output_token_logprobs"][seen[i]:seen[i] + new],
                                         tops[seen[i]:seen[i] + new] if tops is not None else None)
            seen[i] += new
            text = c["text"]
            if holding[i]:
                held[i] += text
                head = held[i].lstrip()
                if mode == "auto" and head and not any(p.startswith(head[:len(p)]) for p in TOOL_CALL_PREFIXES):
                    holding[i], text = False, held[i]
            if not holding[i] and (text or logprobs):
                yield chunk(i, ChatDelta(content=text), logprobs=logprobs)
            if fr is not None:
                metas[i] = meta
                finish = finish_reason(fr)
                if holding[i]:
                    calls = parse_tool_calls(held[i], names)
                    if calls:
                        finish = "tool_calls"
                        yield chunk(i, ChatDelta(tool_calls=[
                            ToolCallDelta(index=k, id=tc.id, type="function",
                                          function={"name": tc.function.name, "arguments": tc.function.arguments})
                            for k, tc in enumerate(calls)]))
                    elif held[i]:
                        yield chunk(i, ChatDelta(content=held[i]))
                yield chunk(i, ChatDelta(), finish)
        if include_usage and all(metas):
            usage = Usage.of(metas[0]["prompt_tokens"], sum(m["completion_tokens"] for m in metas),
                             min(m["cached_tokens"] for m in metas))
            yield sse(ChatCompletionChunk(id=cid, created=created, model=model, choices=[], usage=usage))
        yield SSE_DONE

    return SSEResponse(events())
