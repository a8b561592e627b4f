"""The request side of /v1/chat/completions: the prompt, the tools, and the output constraint.

- The prompt is the model's chat template applied to the messages (text content or text parts;
  `developer` is treated as `system`). Tools are rendered by the template when it takes `tools=`;
  otherwise the tool-call format's instructions are added to the system prompt, and past calls are
  written in that format.
- The tool-call format is the server's `--tool-call-parser`, else the one the chat template uses.
- Output constraints, at most one: `response_format` (json_object / json_schema), a forced tool
  choice (`required`: one or more calls, one with parallel_tool_calls=false; a named function: one
  call of it) written in the format's syntax, or a radixgen extension in the body (`regex`, `ebnf`,
  `json_schema`). With a reasoning parser, response_format and forced calls apply only after the
  reasoning ends; the extensions constrain the whole reply, reasoning included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from radixgen.runtime.server.parsers import (
    CallParser,
    ChoiceParser,
    ReasoningFormat,
    ReasoningParser,
    ToolCallFormat,
    detect_format,
)
from radixgen.runtime.server.parsers.call_format import json_format
from radixgen.runtime.server.protocol import ChatCompletionRequest, NamedToolChoice, bad_request, checked_constraint
from radixgen.runtime.server.state import ServerState


@dataclass(frozen=True)
class ToolSetup:
    """How a request uses its tools."""

    mode: str  # "none" | "auto" | "required" | "named"
    names: list[str]  # the functions the reply may call
    fmt: ToolCallFormat
    parallel: bool  # several calls in one reply
    parameters: dict[str, dict | None] = field(default_factory=dict)  # each tool's parameters schema

    def parser(self) -> CallParser:
        """A parser of this reply's calls."""
        return self.fmt.parser({n: self.parameters.get(n) for n in self.names}, None if self.parallel else 1)

    def marked_by_special_tokens(self, tokenizer: Any) -> bool:
        """Whether calls in this format are marked by special tokens of the vocabulary (Mistral's
        `[TOOL_CALLS]`, Llama's `<|python_tag|>`), which detokenizing drops unless told to keep them."""
        if self.mode == "none":
            return False
        special = getattr(getattr(tokenizer, "hf", None), "all_special_tokens", None) or ()
        text = self.fmt.render_calls([("f", {})])
        return any(tok in text for tok in special)


def tool_setup(state: ServerState, req: ChatCompletionRequest) -> ToolSetup:
    names = [t.function.name for t in req.tools or []]
    choice = req.tool_choice
    template = state.tokenizer.chat_template
    fmt = state.tool_format.for_template(template) if state.tool_format else detect_format(template)
    parameters = {t.function.name: t.function.parameters for t in req.tools or []}
    if choice is None:
        return ToolSetup("auto" if names else "none", names, fmt, req.parallel_tool_calls, parameters)
    if not names and choice != "none":
        raise bad_request("tool_choice needs `tools`", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise bad_request(f"tool_choice names {choice.function.name!r}, which is not in tools {names}",
                              "tool_choice")
        return ToolSetup("named", [choice.function.name], fmt, False, parameters)
    return ToolSetup(choice, names, fmt, req.parallel_tool_calls, parameters)


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def build_messages(state: ServerState, req: ChatCompletionRequest, tools: ToolSetup) -> tuple[list[dict], list | None]:
    """Message dicts for the template, and the `tools=` to pass it (None when described in text)."""
    native = tools.mode != "none" and state.template_uses_tools()
    out: list[dict] = []
    for m in req.messages:
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.role == "assistant" and m.tool_calls:
            calls = [(c.function.name, _arguments(c.function.arguments)) for c in m.tool_calls]
            if native:
                d["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": n, "arguments": a}}
                                   for c, (n, a) in zip(m.tool_calls, calls, strict=True)]
            else:
                d["content"] = "\n".join(x for x in (d["content"], tools.fmt.render_calls(calls)) if x)
        if m.role == "tool":
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            if m.name:
                d["name"] = m.name
        out.append(d)
    if tools.mode == "none":
        return out, None
    specs = [t.model_dump(exclude_none=True, by_alias=True) for t in req.tools or []]
    if native:
        return out, specs
    text = tools.fmt.instructions([s["function"] for s in specs], tools.parallel and tools.mode != "named")
    if out and out[0]["role"] == "system":
        out[0] = dict(out[0], content=f"{out[0]['content']}\n\n{text}" if out[0]["content"] else text)
    else:
        out.insert(0, {"role": "system", "content": text})
    return out, None


# HF apply_chat_template's own arguments: a template variable may not override how it renders
RENDER_ARGUMENTS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"})


def render(state: ServerState, messages: list[dict], tools: list | None,
           template_kwargs: dict[str, Any] | None = None) -> str:
    """The chat template applied to `messages` (with the generation prompt), with the server's
    `--default-chat-template-kwargs` and then the request's `chat_template_kwargs` as template variables
    (e.g. `{"enable_thinking": false}` for Qwen3). Every endpoint that renders chat renders through here."""
    kwargs = {**state.options.template_kwargs(), **(template_kwargs or {})}
    reserved = sorted(RENDER_ARGUMENTS & kwargs.keys())
    if reserved:
        raise bad_request(f"chat_template_kwargs may not set {', '.join(reserved)}", "chat_template_kwargs")
    try:
        if tools is not None:
            kwargs["tools"] = tools
        return state.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    except ValueError as e:
        raise bad_request(str(e), "messages") from None
    except Exception as e:  # a template's raise_exception (e.g. roles must alternate)
        raise bad_request(f"the chat template rejected these messages: {e}", "messages") from None


def _functions(req: ChatCompletionRequest, tools: ToolSetup) -> list[tuple[str, dict]]:
    """(name, parameters schema) of each function the reply may call, each schema checked."""
    out = []
    for t in req.tools or []:
        if t.function.name in tools.names:
            params = t.function.parameters or {"type": "object"}
            checked_constraint("tools", "json_schema", params, strict=bool(t.function.strict))
            out.append((t.function.name, params))
    return out


def constraint(state: ServerState, req: ChatCompletionRequest, sp: dict, tools: ToolSetup,
               reasoning: tuple[ReasoningFormat, str] | None) -> tuple[dict[str, str], str | None]:
    """The engine constraint of this request (see the module docstring): (sampling params to set, the
    request field it came from). `sp` already holds a checked body extension, if any; `reasoning` is
    the reasoning format and where the reply starts (`ReasoningFormat.phase_of`)."""
    wanted = ["tools"] if tools.mode in ("required", "named") else []
    rf = req.response_format
    if rf is not None and rf.type != "text":
        wanted.append("response_format")
    extension = [k for k in ("json_schema", "regex", "ebnf") if k in sp]
    if len(wanted) + len(extension) > 1:
        given = wanted + extension
        raise bad_request(f"only one output constraint may be set, got {', '.join(given)}", given[1])
    if not wanted:
        return {k: sp[k] for k in extension}, (extension[0] if extension else None)
    param = wanted[0]
    thinking = reasoning is not None and reasoning[1] != "closed"
    if param == "response_format":
        assert rf is not None
        body = rf.json_schema
        schema = body.schema_ if body is not None and body.schema_ is not None else {"type": "object"}
        checked = checked_constraint(param, "json_schema", schema, strict=bool(body and body.strict))
        if not thinking:
            return checked, param
        inner = json_format(schema)
    else:
        inner = tools.fmt.constraint(_functions(req, tools), tools.parallel)
    if thinking:
        fmt, phase = reasoning  # type: ignore[misc]
        inner = fmt.constraint(inner, phase)
    return {"structural_tag": json.dumps({"type": "structural_tag", "format": inner}, ensure_ascii=False)}, param


def choice_parsers(state: ServerState, tools: ToolSetup, reasoning: tuple[ReasoningFormat, str] | None,
                   n: int) -> list[ChoiceParser]:
    """One output parser per choice."""
    def one() -> ChoiceParser:
        rp = ReasoningParser(*reasoning) if reasoning is not None else None
        tp = tools.parser() if tools.mode != "none" else None
        return ChoiceParser(rp, tp)

    return [one() for _ in range(n)]
