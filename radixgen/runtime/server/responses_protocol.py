"""Pydantic models of OpenAI's Responses API (`POST /v1/responses`): the request with its input items,
and the response object with its output items and usage.

Field names and shapes follow OpenAI's API reference and the `openai` package's
`openai.types.responses` (`ResponseCreateParams`, `Response`, `ResponseOutputMessage`,
`ResponseFunctionToolCall`, `ResponseReasoningItem`, `ResponseUsage`). Input items are read
leniently (an item without `type` is a message, as `EasyInputMessage`; output items of an earlier
response are valid input); output items are written in the exact shape OpenAI returns. Only what
this server can honour is modelled: function tools, text in and out, JSON-schema output; other tool
and content types are refused with a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from radixgen.runtime.server.protocol import bad_request


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, protected_namespaces=())


# ---------------------------------------------------------------------------------------------- input items

TEXT_PARTS = ("input_text", "output_text", "text")


class ContentPart(_Model):
    """A part of an input message's content: text (`input_text`, or `output_text` of an earlier reply)
    or a refusal; images, files and audio are refused."""

    type: str
    text: str | None = None
    refusal: str | None = None

    def value(self, param: str) -> str:
        if self.type in TEXT_PARTS and self.text is not None:
            return self.text
        if self.type == "refusal" and self.refusal is not None:
            return self.refusal
        raise bad_request(f"content part of type {self.type!r} is not supported: this server reads text parts "
                          f"({', '.join(TEXT_PARTS)})", param)


def content_text(content: str | list[ContentPart], param: str) -> str:
    """The text of a message's (or a function output's) content."""
    if isinstance(content, str):
        return content
    return "".join(p.value(f"{param}.{i}") for i, p in enumerate(content))


class MessageItem(_Model):
    """A message of the conversation (`EasyInputMessage`, `Message`, or an earlier `ResponseOutputMessage`)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Model):
    """A function call the model made (an earlier reply's output item)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Model):
    """The caller's result of a function call, matched to it by `call_id`."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class ReasoningInputItem(_Model):
    """An earlier reply's reasoning. Accepted and left out of the prompt, as chat templates leave a past
    turn's reasoning out."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: str | None = None


def _item_type(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("type") or "message"
    return getattr(value, "type", "message")


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningInputItem, Tag("reasoning")],
    Discriminator(_item_type, custom_error_type="invalid_item", custom_error_message=(
        "unsupported input item: this server reads message, function_call, function_call_output and reasoning "
        "items")),
]


# ---------------------------------------------------------------------------------------------- request


class FunctionTool(_Model):
    """A function the model may call (`tools` holds only these here)."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunction(_Model):
    type: Literal["function"]
    name: str


class TextFormat(_Model):
    """`text.format`: plain text, any JSON object, or JSON matching `schema` (grammar-constrained)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Model):
    format: TextFormat = Field(default_factory=lambda: TextFormat(type="text"))
    verbosity: str | None = None


class ReasoningConfig(_Model):
    """Accepted and echoed: the reasoning a model does is its chat template's affair here."""

    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(_Model):
    """The body of `POST /v1/responses`."""

    model: str | None = None
    input: list[InputItem]  # a text input is read as one user message
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig = Field(default_factory=TextConfig)
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    include: list[str] | None = None  # accepted; nothing optional is included
    conversation: Any = None  # refused: chain with previous_response_id
    prompt: Any = None  # refused: no stored prompt templates
    # radixgen / SGLang extensions, passed on as chat completions takes them (the openai client's extra_body)
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    regex: str | None = None
    ebnf: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false} for Qwen3

    @field_validator("input", mode="before")
    @classmethod
    def _text_input(cls, value: Any) -> Any:
        return [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else value


# ---------------------------------------------------------------------------------------------- output


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(_Model):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(_Model):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText] = Field(default_factory=list)


class OutputFunctionCall(_Model):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class ReasoningText(_Model):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(_Model):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: ItemStatus


OutputItem = OutputMessage | OutputFunctionCall | OutputReasoning


class InputTokensDetails(_Model):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(_Model):
    reasoning_tokens: int = 0


class ResponseUsage(_Model):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(_Model):
    code: str
    message: str


class IncompleteDetails(_Model):
    reason: Literal["max_output_tokens"]


ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class ResponseObject(_Model):
    """OpenAI's `Response`: what POST answers, what the stream's lifecycle events carry, what GET returns."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: ResponseStatus
    background: bool
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    metadata: dict[str, str] | None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig | None
    store: bool
    temperature: float | None
    text: TextConfig
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction
    tools: list[FunctionTool]
    top_p: float | None
    truncation: Literal["auto", "disabled"]
    usage: ResponseUsage | None = None
    user: str | None

    def wire(self) -> dict[str, Any]:
        """The JSON body: nulls kept, as OpenAI sends them, except in `text.format`, which holds only what
        its type uses (the schema under its own name)."""
        out = self.model_dump(mode="json", by_alias=True)
        out["text"]["format"] = self.text.format.model_dump(mode="json", by_alias=True, exclude_none=True)
        return out
