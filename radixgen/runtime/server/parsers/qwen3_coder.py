"""Qwen3-Coder's XML tool calls (SGLang's `qwen3_coder` parser; Qwen3.5 writes them too):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A parameter's value is raw text (whitespace around it is layout, as XGrammar's `qwen_xml` style
reads it), typed by the function's schema: a string stays text, integers and numbers are parsed,
booleans are `true` / `false`, objects and arrays are JSON (or Python literals), `null` is null; a
parameter the schema does not type is JSON if it parses, else text.

The parser reads the reply one character at a time: text until `<tool_call>`, the call committed
(CallStart) once `<function=NAME>` names a known function, each parameter sent as a JSON fragment
(CallArgs: `{"city": "Paris"`, then `, "days": 3`, then `}`) when its `</parameter>` arrives.
Malformed calls are content (before the commit) or revoked (after it), as in tool_calls.py. Forced
calls use XGrammar's `qwen_xml` JSON-schema style for the parameters.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixgen.runtime.server.parsers.call_format import CallParser, ToolCallFormat, calls_format, json_format
from radixgen.runtime.server.parsers.events import CallArgs, CallRevoked, CallStart, Content, Event, append
from radixgen.runtime.server.parsers.tool_calls import new_call_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_WS = " \t\n\r"
# states: text, before `<function=`, its name, between parameters, a parameter's name, its value,
# before `</tool_call>`, plain content
TEXT, HEAD, NAME, BODY, PARAM, VALUE, TAIL, PLAIN = range(8)


def param_value(raw: str, schema: Any) -> Any:
    """A parameter's raw text as the JSON value its schema types it as (see the module docstring)."""
    text = raw.strip(_WS)
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if text.strip().lower() == "null" and "string" not in kinds:
        return None
    if "string" in kinds:
        return text
    try:
        if kinds & {"integer", "number"}:
            number = float(text)
            if not math.isfinite(number):
                return text
            return int(number) if "integer" in kinds or number.is_integer() and "." not in text else number
        if "boolean" in kinds:
            if text.strip().lower() in ("true", "false"):
                return text.strip().lower() == "true"
            return text
        return json.loads(text)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(text)
        json.dumps(value, allow_nan=False)
        return value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


@dataclass(frozen=True)
class Qwen3CoderFormat(ToolCallFormat):
    name: str = "qwen3_coder"

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        def one(name: str, args: Any) -> str:
            params = "".join(f"{PARAMETER}{k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n"
                             f"{PARAMETER_END}\n" for k, v in (args.items() if isinstance(args, dict) else []))
            return f"{OPEN}\n{FUNCTION}{name}>\n{params}{FUNCTION_END}\n{CLOSE}"

        return "\n".join(one(n, a) for n, a in calls)

    def constraint(self, functions: list[tuple[str, dict]], parallel: bool) -> dict:
        tags = [{"type": "tag", "begin": f"{OPEN}\n{FUNCTION}{name}>\n",
                 "content": {**json_format(params), "style": "qwen_xml"},
                 "end": f"\n{FUNCTION_END}\n{CLOSE}"} for name, params in functions]
        return calls_format(tags, "\n", parallel)

    def parser(self, functions: Mapping[str, dict | None], max_calls: int | None = None) -> CallParser:
        return Qwen3CoderParser(functions, max_calls)


class Qwen3CoderParser:
    """Parses Qwen3-Coder XML calls into events (see the module docstring)."""

    def __init__(self, functions: Mapping[str, dict | None], max_calls: int | None = None) -> None:
        self.functions, self.max_calls = dict(functions), max_calls
        self.calls = 0
        self.revoked: set[int] = set()
        self.mode = TEXT
        self._out: list[Event] = []
        self._ws = ""  # whitespace held in TEXT (dropped when a call follows)
        self._lit = ""  # a partial tag being matched
        self._markup = ""  # the text before the current call's `<function=` (`<tool_call>` and whitespace)
        self._call = ""  # the current call's text from `<function=`
        self._name = ""  # the function or parameter name being read
        self._function = ""  # the current call's function
        self._value = ""
        self._index: int | None = None
        self._committed = False
        self._args = 0  # parameters sent in the current call

    def feed(self, text: str) -> list[Event]:
        for ch in text:
            self._char(ch)
        out, self._out = self._out, []
        return out

    def finish(self) -> list[Event]:
        if self.mode in (HEAD, NAME, BODY, PARAM, VALUE):
            self._fail()
        if self.mode == TEXT:
            self._content(self._ws + self._lit if not self.calls else self._lit)
        self.mode, self._ws, self._lit = PLAIN, "", ""
        out, self._out = self._out, []
        return out

    def _content(self, text: str) -> None:
        if text:
            append(self._out, Content(text))

    def _fail(self) -> None:
        """A malformed call: its text is content (and, once committed, all that follows)."""
        if self._committed and self._index is not None:
            self.revoked.add(self._index)
            append(self._out, CallRevoked(self._index))
        self._content(self._markup + self._call + self._lit)
        self._lit, self._call, self._markup = "", "", ""
        self.mode = PLAIN if self._committed else TEXT

    def _match(self, ch: str, *tags: str) -> str | None:
        """Extend the partial tag with `ch`: the tag it completes, "" while it is a prefix of one, None
        when it matches none."""
        held = self._lit + ch
        if held in tags:
            self._lit = ""
            return held
        if any(t.startswith(held) for t in tags):
            self._lit = held
            return ""
        return None

    def _char(self, ch: str) -> None:
        if self.mode == PLAIN:
            self._content(ch)
        elif self.mode == TEXT:
            self._text_char(ch)
        elif self.mode == VALUE:
            self._call += ch
            self._value += ch
            if self._value.endswith(PARAMETER_END):
                self._send_param(self._value[: -len(PARAMETER_END)])
                self.mode = BODY
        elif self.mode in (NAME, PARAM):
            self._call += ch
            if ch != ">":
                self._name += ch
            elif self.mode == PARAM:
                self.mode, self._value = VALUE, ""
            elif self._name in self.functions:
                self._commit()
            else:
                self._fail()
        else:
            self._tag_char(ch)

    def _text_char(self, ch: str) -> None:
        if not self._lit and ch in _WS:
            self._ws += ch
            return
        done = self._match(ch, OPEN)
        if done:
            self.mode, self._markup, self._ws = HEAD, self._ws + done, ""
            self._call, self._committed, self._index = "", False, None
        elif done is None:
            self._content(self._ws + self._lit + ch)
            self._ws = self._lit = ""

    def _tag_char(self, ch: str) -> None:
        """HEAD, BODY, TAIL: whitespace and the tags that may come there."""
        if not self._lit and ch in _WS:
            if self.mode == HEAD:
                self._markup += ch
            else:
                self._call += ch
            return
        tags = {HEAD: (FUNCTION,), BODY: (PARAMETER, FUNCTION_END), TAIL: (CLOSE,)}[self.mode]
        held = self._lit + ch
        done = self._match(ch, *tags)
        if done is None:
            if self.mode == TAIL:  # the call is complete; what follows is content
                self._content(held)
                self._lit, self.mode = "", PLAIN
            else:
                self._lit = held
                self._fail()
            return
        if not done:  # a partial tag
            return
        if self.mode != TAIL:
            self._call += done
        if done == FUNCTION:
            self.mode, self._name = NAME, ""
        elif done == PARAMETER:
            self.mode, self._name = PARAM, ""
        elif done == FUNCTION_END:
            self._send("}" if self._args else "{}")
            self.mode = TAIL
        elif done == CLOSE:
            self.mode, self._call, self._markup = TEXT, "", ""

    def _commit(self) -> None:
        self._committed, self._args, self._index, self._function = True, 0, None, self._name
        if self.max_calls is None or self.calls < self.max_calls:
            self._index = self.calls
            self.calls += 1
            append(self._out, CallStart(self._index, new_call_id(), self._name))
        self.mode = BODY

    def _send_param(self, raw: str) -> None:
        schema = ((self.functions.get(self._function) or {}).get("properties") or {}).get(self._name)
        value = json.dumps(param_value(raw, schema), ensure_ascii=False)
        self._send(f'{"{" if not self._args else ", "}{json.dumps(self._name)}: {value}')
        self._args += 1

    def _send(self, text: str) -> None:
        if self._index is not None:
            append(self._out, CallArgs(self._index, text))
