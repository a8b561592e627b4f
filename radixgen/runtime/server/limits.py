"""Per-field limits on request bodies, checked on the parsed JSON before the route runs.

`check_body(path, body, options)` knows where each route keeps the fields that cost the server:
`n` (times the prompt count), stop strings, tools, and output constraints (`response_format`'s
schema, `json_schema` / `regex` / `ebnf`, also inside /generate's `sampling_params`). Each limit is
a `ServerOptions` field, and a request over one gets a 400 in OpenAI's shape naming the field, the
limit and its flag, with OpenAI's codes (`integer_above_max_value`, `array_above_max_length`,
`string_above_max_length`). A tool's parameters must be a valid JSON schema whatever `tool_choice`
is. Fields of the wrong type are left to the route's own validation (pydantic), which names them.
With `--reject-unknown-fields` a chat, completions or embeddings body's top-level field the route does
not define is a 400 (`unknown_field`), as the hosted API answers; by default it is ignored with a
warning naming the fields, as vLLM does (so a client sending newer OpenAI fields keeps working).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from radixgen.runtime.server.embeddings import EmbeddingRequest
from radixgen.runtime.server.options import ServerOptions
from radixgen.runtime.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, bad_request
from radixgen.runtime.server.responses_protocol import ResponsesRequest

logger = logging.getLogger("radixgen.server")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def json_depth(value: Any) -> int:
    """Nesting depth of objects and arrays in a JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        deepest = max(deepest, d)
        stack.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))
    return deepest


def check_schema(schema: Any, param: str, opts: ServerOptions, code: str = "invalid_schema") -> Any:
    """Size and depth limits of a JSON schema (a dict / bool, or JSON text); returns the parsed schema."""
    if isinstance(schema, str):
        _check_size(len(schema.encode("utf-8", "surrogatepass")), param, opts)
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise _too_deep(param, None, opts) from None
        except ValueError:
            return None  # not JSON: the constraint check says so
    depth = json_depth(schema)
    if depth > opts.max_schema_depth:
        raise _too_deep(param, depth, opts)
    _check_size(len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")),
                param, opts)
    return schema


def _too_deep(param: str, depth: int | None, opts: ServerOptions) -> APIError:
    deep = f"nested {depth} levels deep" if depth is not None else "nested too deeply to parse"
    return bad_request(f"{param} is {deep} (objects and arrays); this server allows {opts.max_schema_depth} "
                       f"({_flag('max_schema_depth')})", param, "schema_too_deep")


def _check_size(size: int, param: str, opts: ServerOptions) -> None:
    if size > opts.max_schema_bytes:
        raise bad_request(f"{param} is {size} bytes; this server allows {opts.max_schema_bytes} "
                          f"({_flag('max_schema_bytes')})", param, "string_above_max_length")


def check_tool_schemas(tools: Any, opts: ServerOptions, flat: bool = False) -> None:
    """Tool count, and each tool's parameters: size, depth, and a valid JSON schema. `flat`: tools as the
    Responses API writes them, name and parameters in the tool itself rather than under `function`."""
    from radixgen.grammar.base import GrammarError
    from radixgen.grammar.schema import validate_schema

    if not isinstance(tools, list):
        return
    if len(tools) > opts.max_tools:
        raise bad_request(f"Invalid 'tools': array too long. Expected an array with maximum length {opts.max_tools} "
                          f"({_flag('max_tools')}), but got an array with length {len(tools)} instead.", "tools",
                          "array_above_max_length")
    for i, tool in enumerate(tools):
        fn = tool if flat else tool.get("function") if isinstance(tool, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        if params is None:
            continue
        param = f"tools.{i}.parameters" if flat else f"tools.{i}.function.parameters"
        check_schema(params, param, opts)
        try:
            validate_schema(params)
        except (GrammarError, RecursionError) as e:
            raise bad_request(f"Invalid schema for function {fn.get('name')!r}: {e}", param,
                              "invalid_function_parameters") from None


def check_stop(stop: Any, param: str, opts: ServerOptions) -> None:
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list):
        return
    if len(stops) > opts.max_stop_strings:
        raise bad_request(f"Invalid '{param}': array too long. Expected an array with maximum length "
                          f"{opts.max_stop_strings} ({_flag('max_stop_strings')}), but got an array with length "
                          f"{len(stops)} instead.", param, "array_above_max_length")
    for s in stops:
        if isinstance(s, str) and len(s) > opts.max_stop_length:
            raise bad_request(f"Invalid '{param}': a stop string has {len(s)} characters; this server allows "
                              f"{opts.max_stop_length} ({_flag('max_stop_length')})", param,
                              "string_above_max_length")


def check_n(n: Any, prompts: int, param: str, opts: ServerOptions) -> None:
    if not _is_int(n):
        return
    if n * prompts > opts.max_n:
        asked = f"{n}" if prompts == 1 else f"{n} for each of {prompts} prompts ({n * prompts} sequences)"
        raise bad_request(f"Invalid '{param}': integer above maximum value. Expected at most {opts.max_n} sequences "
                          f"per request ({_flag('max_n')}), but got {asked} instead.", param,
                          "integer_above_max_value")


def check_constraints(fields: dict, prefix: str, opts: ServerOptions) -> None:
    """The SGLang-style constraint fields `json_schema`, `regex`, `ebnf` of a body or sampling_params."""
    if fields.get("json_schema") is not None:
        check_schema(fields["json_schema"], prefix + "json_schema", opts)
    for key in ("regex", "ebnf"):
        value = fields.get(key)
        if isinstance(value, str):
            _check_size(len(value.encode("utf-8", "surrogatepass")), prefix + key, opts)


def _prompt_count(prompt: Any) -> int:
    """How many prompts a `prompt` / `text` / `input_ids` field holds (a flat token list is one)."""
    if isinstance(prompt, list) and prompt and not all(_is_int(p) for p in prompt):
        return len(prompt)
    return 1


def _chat(body: dict, opts: ServerOptions) -> None:
    check_n(body.get("n"), 1, "n", opts)
    check_stop(body.get("stop"), "stop", opts)
    check_tool_schemas(body.get("tools"), opts)
    rf = body.get("response_format")
    spec = rf.get("json_schema") if isinstance(rf, dict) else None
    if isinstance(spec, dict) and spec.get("schema") is not None:
        check_schema(spec["schema"], "response_format.json_schema.schema", opts)
    check_constraints(body, "", opts)


def _responses(body: dict, opts: ServerOptions) -> None:
    check_tool_schemas(body.get("tools"), opts, flat=True)
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("schema") is not None:
        check_schema(fmt["schema"], "text.format.schema", opts)
    check_stop(body.get("stop"), "stop", opts)
    check_constraints(body, "", opts)


def _completions(body: dict, opts: ServerOptions) -> None:
    check_n(body.get("n", 1), _prompt_count(body.get("prompt")), "n", opts)
    check_stop(body.get("stop"), "stop", opts)
    check_constraints(body, "", opts)


def _generate(body: dict, opts: ServerOptions) -> None:
    prompts = _prompt_count(body["text"] if body.get("text") is not None else body.get("input_ids"))
    sps = body.get("sampling_params")
    if isinstance(sps, dict):
        check_n(sps.get("n", 1), prompts, "sampling_params.n", opts)
        sps = [sps]
    elif isinstance(sps, list):
        total = sum(sp.get("n", 1) for sp in sps if isinstance(sp, dict) and _is_int(sp.get("n", 1)))
        check_n(total, 1, "sampling_params.n", opts)
    else:
        return
    for i, sp in enumerate(sps):
        if isinstance(sp, dict):
            prefix = "sampling_params." if len(sps) == 1 and isinstance(body.get("sampling_params"), dict) \
                else f"sampling_params.{i}."
            check_stop(sp.get("stop"), prefix + "stop", opts)
            check_constraints(sp, prefix, opts)


ROUTES: dict[str, Callable[[dict, ServerOptions], None]] = {
    "/v1/chat/completions": _chat,
    "/v1/completions": _completions,
    "/v1/responses": _responses,
    "/generate": _generate,
}


def _accepted_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for n, f in model.model_fields.items() for name in (n, f.alias) if name)


OPENAI_FIELDS = {"/v1/chat/completions": _accepted_fields(ChatCompletionRequest),
                 "/v1/completions": _accepted_fields(CompletionRequest),
                 "/v1/embeddings": _accepted_fields(EmbeddingRequest),
                 "/v1/responses": _accepted_fields(ResponsesRequest)}


def check_body(path: str, body: Any, opts: ServerOptions) -> None:
    """Raise a 400 APIError for the first field of `body` over a limit (routes not listed: nothing), or,
    with `reject_unknown_fields`, for a top-level field an OpenAI route does not define."""
    if not isinstance(body, dict):
        return
    known = OPENAI_FIELDS.get(path)
    unknown = [k for k in body if k not in known] if known is not None else []
    if unknown and opts.reject_unknown_fields:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]} (this server answers 400 for "
                          f"fields it does not know: {_flag('reject_unknown_fields')})", unknown[0], "unknown_field")
    if unknown:
        logger.warning("%s: the request's fields %s are not supported and were ignored", path,
                       ", ".join(map(repr, unknown)))
    check = ROUTES.get(path)
    if check is not None:
        check(body, opts)
