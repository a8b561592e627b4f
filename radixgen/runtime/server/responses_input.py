"""A Responses request as the chat request it means, so that it runs through chat.py's path unchanged.

The conversation is the earlier turns of a `previous_response_id` chain, then `instructions`, then the
input items, each written as a chat-completions client would write it:
- a message keeps its role and its text (`developer` is the system role to chat);
- `function_call` items are the `tool_calls` of an assistant message; calls right after an assistant
  message join it (the text and parallel calls of one reply are one chat message);
- `function_call_output` is a `tool` message answering its `call_id`;
- `reasoning` items are left out, as chat templates leave a past turn's reasoning out.
`instructions` go first as a system message, and only this request's: OpenAI does not carry a
previous response's instructions over. Because the chain renders exactly the messages a chat client
would send, a chained turn's prompt starts with the previous turn's prompt and reply, which the radix
cache holds.

`text.format` becomes `response_format`, except where `tool_choice` forces calls (`required` or a named
function): that reply is calls only, so the format has no text to constrain. Errors the chat path raises
name chat's fields; `responses_error` renames them to this API's (`messages` -> `input`, ...).
"""

from __future__ import annotations

from radixgen.runtime.server.protocol import (
    APIError,
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDef,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    StreamOptions,
    Tool,
    ToolCall,
    bad_request,
)
from radixgen.runtime.server.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    OutputItem,
    ReasoningInputItem,
    ResponsesRequest,
    content_text,
)

# radixgen / SGLang extensions, passed on to chat as they are
EXTENSIONS = ("seed", "top_k", "min_p", "repetition_penalty", "stop", "ignore_eos", "regex", "ebnf",
              "chat_template_kwargs")
# chat's field -> this API's, for errors raised on the chat path
_PARAMS = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens",
           "max_completion_tokens": "max_output_tokens"}


def as_input(item: OutputItem) -> InputItem:
    """An output item as the input item that continues the conversation after it."""
    data = item.model_dump(mode="json")
    if data["type"] == "message":
        return MessageItem.model_validate(data)
    if data["type"] == "function_call":
        return FunctionCallItem.model_validate(data)
    return ReasoningInputItem.model_validate(data)


def chat_messages(items: list[InputItem], param: str) -> list[ChatMessage]:
    """Chat messages of a conversation's items (see the module docstring); `param` names the field the
    items came from, for errors (`input` -> `input.3.content`)."""
    out: list[ChatMessage] = []
    for i, item in enumerate(items):
        where = f"{param}.{i}"
        if isinstance(item, MessageItem):
            out.append(ChatMessage(role=item.role, content=content_text(item.content, f"{where}.content")))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            out.append(ChatMessage(role="tool", tool_call_id=item.call_id,
                                   content=content_text(item.output, f"{where}.output")))
    return out


def chat_request(req: ResponsesRequest, history: list[InputItem]) -> ChatCompletionRequest:
    """The chat request `req` means after the conversation `history` (a chain's earlier turns)."""
    if req.conversation is not None:
        raise bad_request("conversation is not supported: chain responses with previous_response_id",
                          "conversation")
    if req.prompt is not None:
        raise bad_request("prompt templates are not supported: send instructions and input", "prompt")
    messages = chat_messages(history, "previous_response_id") + chat_messages(req.input, "input")
    if req.instructions:
        messages.insert(0, ChatMessage(role="system", content=req.instructions))
    if not messages:
        raise bad_request("input is empty: give at least one message", "input")
    choice = req.tool_choice
    forced = choice == "required" or not isinstance(choice, str)
    if isinstance(choice, str):
        tool_choice: str | NamedToolChoice | None = None if choice == "auto" and not req.tools else choice
    else:
        tool_choice = NamedToolChoice(function=NamedFunction(name=choice.name))
    return ChatCompletionRequest(
        model=req.model, messages=messages, max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature, top_p=req.top_p, user=req.user, stream=req.stream,
        stream_options=StreamOptions(include_usage=True) if req.stream else None,
        tools=[Tool(function=FunctionDef(name=t.name, description=t.description, parameters=t.parameters,
                                         strict=t.strict)) for t in req.tools] or None,
        tool_choice=tool_choice,  # None: chat's default, whose explicit "auto" needs tools
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=None if forced else _response_format(req),
        **{k: getattr(req, k) for k in EXTENSIONS if getattr(req, k) is not None})


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    if fmt.schema_ is None:
        raise bad_request("text.format of type json_schema needs a `schema`", "text.format.schema")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
        name=fmt.name or "response", description=fmt.description, schema=fmt.schema_, strict=fmt.strict))


def responses_error(e: APIError) -> APIError:
    """`e`, raised on the chat path, with its parameter named as this API names it."""
    if e.param is None:
        return e
    head = e.param.split(".", 1)[0]
    if head not in _PARAMS:
        return e
    param = _PARAMS[head]  # the index of a message is not that of an input item
    message = e.message.replace("max_tokens", "max_output_tokens") if head.startswith("max_") else e.message
    renamed = APIError(e.status, message, e.type, param, e.code)
    renamed.headers = getattr(e, "headers", None)  # type: ignore[attr-defined]
    return renamed
