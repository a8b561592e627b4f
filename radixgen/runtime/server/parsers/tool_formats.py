"""How model families write tool calls: the markers around the JSON call objects, how a past call is
written back into the prompt, the instructions for chat templates that do not render tools, and the
grammar (an XGrammar structural tag) that forces calls in the format when `tool_choice` is required
or names a function. The registry of every format (`--tool-call-parser` names, SGLang's) and the
detection of a chat template's format are here too.

- `hermes` (Hermes, Qwen2.5 / Qwen3, SmolLM3): one call per tag,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, tags one after another.
- `llama3_json` (Llama 3.1 / 3.2 JSON tool calling): the whole reply is the call
  `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`; several are separated by `; `.
- `smollm2` (the format SmolLM2's tool-use prompt asks for, also what radixgen describes to models whose
  template has no tools): `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>`; a bare
  JSON list or object at the start of the reply is read as calls too.
- `mistral` (mistral.py), `pythonic` (pythonic.py), `qwen3_coder` (qwen3_coder.py): formats whose
  calls are not one JSON object each.

Formats were read off the model cards and chat templates; the parser (tool_calls.py) accepts either
`arguments` or `parameters` in every format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixgen.runtime.server.parsers.call_format import (
    ARGS_KEYS,
    CallParser,
    ToolCallFormat,
    calls_format,
    json_format,
)
from radixgen.runtime.server.parsers.mistral import MistralFormat
from radixgen.runtime.server.parsers.pythonic import PythonicFormat
from radixgen.runtime.server.parsers.qwen3_coder import Qwen3CoderFormat
from radixgen.runtime.server.parsers.tool_calls import ToolCallParser

__all__ = ["ARGS_KEYS", "FORMATS", "JsonCallFormat", "ToolCallFormat", "detect_format", "json_format"]


@dataclass(frozen=True)
class JsonCallFormat(ToolCallFormat):
    """One family's syntax of JSON call objects (see the module docstring).

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

    def constraint(self, functions: list[tuple[str, dict]], parallel: bool) -> dict:
        """An XGrammar structural-tag format forcing one or more calls (one if not `parallel`) of these
        (name, parameters schema) functions. The name is part of each call's fixed opening text, so it
        is written first and the arguments stream after it."""
        tags = [{"type": "tag", "begin": f'{self.call_open}{{"name": {json.dumps(name)}, "{self.args_key}": ',
                 "content": json_format(params), "end": "}" + self.call_close} for name, params in functions]
        return calls_format(tags, self.separator, parallel, self.head, self.tail)

    def parser(self, functions: Mapping[str, dict | None], max_calls: int | None = None) -> CallParser:
        return ToolCallParser(self, list(functions), max_calls)

    def call_schema(self, name: str, parameters: dict | None) -> dict:
        """JSON schema of one call object of function `name` (for backends without structural tags)."""
        return {"type": "object", "properties": {"name": {"const": name},
                                                 self.args_key: parameters or {"type": "object"}},
                "required": ["name", self.args_key], "additionalProperties": False}


FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (
    JsonCallFormat("hermes", "<tool_call>", "</tool_call>", bare_start=False, args_key="arguments",
                   head="", call_open="<tool_call>\n", call_close="\n</tool_call>", separator="\n", tail=""),
    JsonCallFormat("llama3_json", "<|python_tag|>", None, bare_start=True, args_key="parameters",
                   head="", call_open="", call_close="", separator="; ", tail=""),
    JsonCallFormat("smollm2", "<tool_call>", "</tool_call>", bare_start=True, args_key="arguments",
                   head="<tool_call>[", call_open="", call_close="", separator=", ", tail="]</tool_call>"),
    MistralFormat(compact=False),
    PythonicFormat(),
    Qwen3CoderFormat(),
)}


def detect_format(chat_template: str | None) -> ToolCallFormat:
    """The tool-call format a chat template uses (SmolLM2's for templates that show none), in the
    variant it writes (`ToolCallFormat.for_template`)."""
    text = chat_template or ""
    if "<function=" in text and "<parameter=" in text:
        found = FORMATS["qwen3_coder"]
    elif "<tool_call>" in text and "tools" in text:
        found = FORMATS["hermes"]
    elif "[TOOL_CALLS]" in text:
        found = FORMATS["mistral"]
    elif "<|python_tag|>" in text or "ipython" in text:
        found = FORMATS["llama3_json"]
    elif "[func_name1(" in text or "<|python_start|>" in text:  # Llama 3.2 / 4's pythonic instructions
        found = FORMATS["pythonic"]
    else:
        found = FORMATS["smollm2"]
    return found.for_template(chat_template)
