"""Pydantic models of the OpenAI HTTP API (chat completions, legacy completions, models, errors) and of
the native `/generate` endpoint, plus the mapping of OpenAI sampling fields onto the engine's
SGLang-named `sampling_params`.

Follows OpenAI's API reference (https://platform.openai.com/docs/api-reference) for field names and
shapes; the radixgen / SGLang extensions (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`,
`ignore_eos`, `stop_token_ids`, `regex`, `ebnf`, `json_schema`, `skip_special_tokens`) ride along in
the body (the openai client's `extra_body`). Unknown fields are ignored, as OpenAI-compatible servers
usually do. Range checks live in `radixgen.sampling.params` (the engine validates at its boundary);
errors name the OpenAI field (`max_tokens`, not `max_new_tokens`).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# ---------------------------------------------------------------------------------------------- errors

# SGLang sampling-param names the engine's messages use -> the OpenAI field a client sent.
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "top_logprobs": "top_logprobs"}


class APIError(Exception):
    """An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


KNOWN_PARAMS = ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                "presence_penalty", "repetition_penalty", "logit_bias", "seed", "stop_token_ids", "stop",
                "ignore_eos", "top_logprobs", "json_schema", "regex", "ebnf", "structural_tag", "input_ids",
                "prompt", "sampling_params", "n")


def error_from_value_error(e: ValueError, constraint_param: str | None = None) -> APIError:
    """Map an engine / validation ValueError onto a 400 naming the parameter: the request's constraint
    parameter for grammar errors, else the first known parameter name in the message."""
    msg = str(e)
    if "context length" in msg or "more than the KV pool" in msg:
        return bad_request(msg, None, "context_length_exceeded")
    if type(e).__name__ == "GrammarError":
        return bad_request(msg, constraint_param, "invalid_schema" if "schema" in msg.lower() else "invalid_constraint")
    first = msg.split(" ", 1)[0].strip("'\"`:,").split("[", 1)[0]
    param = first if first in KNOWN_PARAMS else None
    if param is None:
        hits = [(m.start(), name) for name in KNOWN_PARAMS if len(name) > 2
                for m in [re.search(rf"(?<![\w.]){name}(?!\w)", msg)] if m]
        param = min(hits)[1] if hits else None
    if param in OPENAI_NAMES:
        param = OPENAI_NAMES[param]
        msg = msg.replace("max_new_tokens", "max_tokens").replace("min_new_tokens", "min_tokens")
    return bad_request(msg, param)


def checked_constraint(param: str, kind: str, value: Any, strict: bool = False) -> dict[str, Any]:
    """Check a json_schema (dict or JSON text) / regex / ebnf constraint at the boundary; return the
    engine sampling param for it. A bad one is a 400 naming `param`."""
    from radixgen.grammar.base import GrammarError
    from radixgen.grammar.schema import ebnf_spec, json_schema_spec, regex_spec

    try:
        if kind == "json_schema":
            json_schema_spec(value, strict=strict)  # strict: 400 naming a keyword no grammar backend enforces
            out: dict[str, Any] = {"json_schema": value if isinstance(value, str) else json.dumps(value)}
            if strict:  # the engine checks again against the backend that compiles it
                out["strict_schema"] = True
            return out
        if kind == "regex":
            regex_spec(value)
        elif kind == "ebnf":
            ebnf_spec(value)
        else:
            raise GrammarError(f"unknown constraint {kind!r}")
    except GrammarError as e:
        raise bad_request(f"invalid {param}: {e}", param, "invalid_schema" if kind == "json_schema" else None) \
            from None
    return {kind: value}


# ---------------------------------------------------------------------------------------------- shared


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, protected_namespaces=())


class StreamOptions(_Model):
    include_usage: bool = False


class SamplingFields(_Model):
    """Sampling fields shared by /v1/chat/completions and /v1/completions."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # radixgen / SGLang constraint extensions
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | dict | None = None
    any_whitespace: bool | None = None  # pretty JSON allowed (default compact)
    budget_aware: bool | None = None  # close constrained output before max_tokens (finish_reason forced)

    def constraint_param(self) -> str | None:
        """The body field holding this request's constraint extension, if any (for error messages)."""
        return next((k for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None), None)

    def sampling_params(self, max_tokens: int | None, default_max_tokens: int) -> dict[str, Any]:
        """SGLang-named sampling params for the engine (n stays with the caller)."""
        sp: dict[str, Any] = {"max_new_tokens": default_max_tokens if max_tokens is None else max_tokens}
        for ours, name in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                           ("min_p", "min_p"), ("frequency_penalty", "frequency_penalty"),
                           ("presence_penalty", "presence_penalty"), ("repetition_penalty", "repetition_penalty"),
                           ("seed", "seed"), ("stop_token_ids", "stop_token_ids"), ("ignore_eos", "ignore_eos"),
                           ("min_new_tokens", "min_tokens"), ("skip_special_tokens", "skip_special_tokens"),
                           ("any_whitespace", "any_whitespace"), ("budget_aware", "budget_aware")):
            value = getattr(self, name)
            if value is not None:
                sp[ours] = value
        if self.stop:
            sp["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if self.logit_bias:
            try:
                sp["logit_bias"] = {int(k): float(v) for k, v in self.logit_bias.items()}
            except ValueError:
                raise bad_request("logit_bias keys must be token ids (integers as strings)", "logit_bias") from None
        constraints = [(k, getattr(self, k)) for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None]
        if len(constraints) > 1:
            raise bad_request(f"only one of json_schema, regex, ebnf may be set, got {[k for k, _ in constraints]}",
                              constraints[1][0])
        for k, v in constraints:
            sp.update(checked_constraint(k, k, v))
        if self.n < 1:
            raise bad_request(f"n must be >= 1, got {self.n}", "n")
        return sp


class UsageDetails(_Model):
    cached_tokens: int = 0


class Usage(_Model):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: UsageDetails | None = None

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int) -> Usage:
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=UsageDetails(cached_tokens=cached))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


# ---------------------------------------------------------------------------------------------- chat


class ContentPart(_Model):
    type: str
    text: str | None = None


class FunctionCall(_Model):
    name: str
    arguments: str


class ToolCall(_Model):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.type != "text" or p.text is None:
                raise bad_request(f"content part of type {p.type!r} is not supported: send text parts only",
                                  "messages")
            parts.append(p.text)
        return "".join(parts)


class FunctionDef(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Model):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(_Model):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # variables for the chat template (SGLang, vLLM)


class ChatLogprobTop(_Model):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(ChatLogprobTop):
    top_logprobs: list[ChatLogprobTop] = Field(default_factory=list)


class ChatLogprobs(_Model):
    content: list[ChatLogprobToken] | None = None


class ChatResponseMessage(_Model):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Model):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


class ChatCompletionResponse(_Model):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(_Model):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str] | None = None


class ChatDelta(_Model):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatStreamChoice(_Model):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Model):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


# ---------------------------------------------------------------------------------------------- completions


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


class CompletionLogprobs(_Model):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Model):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


class CompletionResponse(_Model):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# ---------------------------------------------------------------------------------------------- models / native


class ModelCard(_Model):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "radixgen"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(_Model):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class GenerateRequest(_Model):
    """Native request: the engine's `async_generate` arguments (SGLang's /generate body)."""

    model_config = ConfigDict(extra="forbid")
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    rid: str | None = None
    extra_key: str | None = None
    return_text_in_logprobs: bool = False  # logprob entries carry the token's text (SGLang)
    image_data: Any = None  # refused: text-only models (SGLang's client sends it for sgl.image)


class ConcateAndAppendRequest(_Model):
    """What SGLang's client posts for join(mode="concate_and_append")."""

    src_rids: list[str]
    dst_rid: str


class TokenizeRequest(_Model):
    text: str | list[str]
    add_special_tokens: bool = True


class DetokenizeRequest(_Model):
    tokens: list[int]
    skip_special_tokens: bool = True
