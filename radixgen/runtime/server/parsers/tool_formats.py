"""How model families write tool calls: the markers around the JSON call objects, how a past call is
written back into the prompt, the instructions for chat templates that do not render tools, and the
grammar (an XGrammar structural tag) that forces calls in the format when `tool_choice` is required
or names a function.

- `hermes` (Hermes, Qwen2.5 / Qwen3, SmolLM3): one call per tag,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, tags one after another.
- `llama3_json` (Llama 3.1 / 3.2 JSON tool calling): the whole reply is the call
  `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`; several are separated by `; `.
- `smollm2` (the format SmolLM2's tool-use prompt asks for, also what radixgen describes to models whose
  template has no tools): `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>`; a bare
  JSON list or object at the start of the reply is read as calls too.

Formats were read off the model cards and chat templates; the parser (tool_calls.py) accepts either
`arguments` or `parameters` in every format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ARGS_KEYS = ("arguments", "parameters")  # the member holding a call's arguments, in every format


@dataclass(frozen=True)
class ToolCallFormat:
    """One family's tool-call syntax (see the module docstring); subclasses say how calls are written."""

    name: str
    open: str | None  # marker opening a section of calls
    close: str | None  # marker closing it (None: the section runs to the end of the calls)
    bare_start: bool  # a reply that starts with `{` or `[` opens a section without the marker
    args_key: str  # the member name this format writes the arguments under

    def call_json(self, name: str, arguments: Any) -> str:
        return json.dumps({"name": name, self.args_key: arguments}, ensure_ascii=False)

    def call_schema(self, name: str, parameters: dict | None) -> dict:
        """JSON schema of one call object of function `name` in this format."""
        return {"type": "object", "properties": {"name": {"const": name},
                                                 self.args_key: parameters or {"type": "object"}},
                "required": ["name", self.args_key], "additionalProperties": False}

    def instructions(self, functions: list[dict], parallel: bool) -> str:
        """A system-prompt paragraph describing the tools, for templates that do not render them."""
        arg = {"<argument>": "<value>"}
        example = self.render_calls([("<function name>", arg)])
        several = ""
        if parallel:
            two = self.render_calls([("<function name>", arg), ("<another function>", arg)])
            several = f"To make several calls at once, write:\n{two}\n"
        specs = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
        return (f"You can call the functions below. To call one, reply with only:\n{example}\n{several}"
                f"Functions (JSON Schema):\n<tools>\n{specs}\n</tools>")

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        """The text of an assistant turn making these (name, arguments) calls."""
        raise NotImplementedError

    def constraint(self, call_schemas: list[dict], parallel: bool) -> dict:
        """An XGrammar structural-tag format forcing one or more calls (one if not `parallel`)."""
        raise NotImplementedError


class HermesFormat(ToolCallFormat):
    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return "\n".join(f"<tool_call>\n{self.call_json(n, a)}\n</tool_call>" for n, a in calls)

    def constraint(self, call_schemas: list[dict], parallel: bool) -> dict:
        tag = {"type": "tag", "begin": "<tool_call>\n", "content": json_format(any_of(call_schemas)),
               "end": "\n</tool_call>"}
        return {"type": "tags_with_separator", "tags": [tag], "separator": "\n", "at_least_one": True,
                "stop_after_first": not parallel}


class Llama3JsonFormat(ToolCallFormat):
    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return "; ".join(self.call_json(n, a) for n, a in calls)

    def constraint(self, call_schemas: list[dict], parallel: bool) -> dict:
        one = json_format(any_of(call_schemas))
        if not parallel:
            return one
        more = {"type": "sequence", "elements": [{"type": "const_string", "value": "; "}, one]}
        return {"type": "sequence", "elements": [one, {"type": "star", "content": more}]}


class SmolLM2Format(ToolCallFormat):
    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        return f"<tool_call>[{', '.join(self.call_json(n, a) for n, a in calls)}]</tool_call>"

    def constraint(self, call_schemas: list[dict], parallel: bool) -> dict:
        array = {"type": "array", "items": any_of(call_schemas), "minItems": 1, **({} if parallel else {"maxItems": 1})}
        return {"type": "tag", "begin": "<tool_call>", "content": json_format(array), "end": "</tool_call>"}


def any_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def json_format(schema: Any) -> dict:
    """A structural-tag element for JSON matching `schema`; at most one whitespace character in a row
    (JSON's own spacing, without letting a model pad output with endless blanks)."""
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}


FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (
    HermesFormat("hermes", "<tool_call>", "</tool_call>", bare_start=False, args_key="arguments"),
    Llama3JsonFormat("llama3_json", "<|python_tag|>", None, bare_start=True, args_key="parameters"),
    SmolLM2Format("smollm2", "<tool_call>", "</tool_call>", bare_start=True, args_key="arguments"),
)}


def detect_format(chat_template: str | None) -> ToolCallFormat:
    """The tool-call format a chat template uses (SmolLM2's for templates that show none)."""
    text = chat_template or ""
    if "<tool_call>" in text and "tools" in text:
        return FORMATS["hermes"]
    if "<|python_tag|>" in text or "ipython" in text:
        return FORMATS["llama3_json"]
    return FORMATS["smollm2"]
