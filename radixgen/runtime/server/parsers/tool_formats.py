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
    """One family's tool-call syntax (see the module docstring).

    The parser reads sections of calls between `open` and `close`; a reply making calls is written
    `head + separator.join(call_open + CALL + call_close) + tail`, CALL being the JSON call object.
    """

    name: str
    open: str | None  # marker opening a section of calls
    close: str | None  # marker closing it (None: the section runs to the end of the calls)
    bare_start: bool  # a reply that starts with `{` or `[` opens a section without the marker
    args_key: str  # the member name this format writes the arguments under
    head: str
    call_open: str
    call_close: str
    separator: str
    tail: str

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        """The text of an assistant turn making these (name, arguments) calls."""
        objs = (json.dumps({"name": n, self.args_key: a}, ensure_ascii=False) for n, a in calls)
        return self.head + self.separator.join(self.call_open + o + self.call_close for o in objs) + self.tail

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

    def constraint(self, functions: list[tuple[str, dict]], parallel: bool) -> dict:
        """An XGrammar structural-tag format forcing one or more calls (one if not `parallel`) of these
        (name, parameters schema) functions. The name is part of each call's fixed opening text, so it
        is written first and the arguments stream after it."""
        tags = [{"type": "tag", "begin": f'{self.call_open}{{"name": {json.dumps(name)}, "{self.args_key}": ',
                 "content": json_format(params), "end": "}" + self.call_close} for name, params in functions]
        calls = {"type": "tags_with_separator", "tags": tags, "separator": self.separator, "at_least_one": True,
                 "stop_after_first": not parallel}
        parts = [{"type": "const_string", "value": text} for text in (self.head,) if text]
        parts += [calls] + [{"type": "const_string", "value": text} for text in (self.tail,) if text]
        return calls if len(parts) == 1 else {"type": "sequence", "elements": parts}

    def call_schema(self, name: str, parameters: dict | None) -> dict:
        """JSON schema of one call object of function `name` (for backends without structural tags)."""
        return {"type": "object", "properties": {"name": {"const": name},
                                                 self.args_key: parameters or {"type": "object"}},
                "required": ["name", self.args_key], "additionalProperties": False}


def any_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def json_format(schema: Any) -> dict:
    """A structural-tag element for JSON matching `schema`; at most one whitespace character in a row
    (JSON's own spacing, without letting a model pad output with endless blanks)."""
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}


FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (
    ToolCallFormat("hermes", "<tool_call>", "</tool_call>", bare_start=False, args_key="arguments",
                   head="", call_open="<tool_call>\n", call_close="\n</tool_call>", separator="\n", tail=""),
    ToolCallFormat("llama3_json", "<|python_tag|>", None, bare_start=True, args_key="parameters",
                   head="", call_open="", call_close="", separator="; ", tail=""),
    ToolCallFormat("smollm2", "<tool_call>", "</tool_call>", bare_start=True, args_key="arguments",
                   head="<tool_call>[", call_open="", call_close="", separator=", ", tail="]</tool_call>"),
)}


def detect_format(chat_template: str | None) -> ToolCallFormat:
    """The tool-call format a chat template uses (SmolLM2's for templates that show none)."""
    text = chat_template or ""
    if "<tool_call>" in text and "tools" in text:
        return FORMATS["hermes"]
    if "<|python_tag|>" in text or "ipython" in text:
        return FORMATS["llama3_json"]
    return FORMATS["smollm2"]
