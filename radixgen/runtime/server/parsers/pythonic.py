"""Pythonic tool calls (Llama 3.2 / Llama 4, SGLang's `pythonic` parser): the reply is a Python list of
calls with keyword arguments, `[get_weather(city="Paris", days=3), get_time(tz="CET")]`, optionally
between Llama 4's `<|python_start|>` and `<|python_end|>`.

The parser reads the list one character at a time. A call is committed (CallStart) at the `(` after a
known function name; each argument is sent (CallArgs, a JSON fragment: `{"city": "Paris"`, then
`, "days": 3`, then `}`) once its value ends at a top-level `,` or `)`. Values are Python literals
(`ast.literal_eval`; JSON's `true` / `false` / `null` are read too). A reply that does not start
with the list is content; a malformed call is content (before its commit) or revoked (after it),
as in tool_calls.py.

Forced calls are written by a structural tag: required arguments in the schema's order, then the
optional ones, each value a JSON literal of its schema (a JSON string or number is a Python literal)
except booleans and null, which take Python's `True` / `False` / `None`.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixgen.runtime.server.parsers.call_format import CallParser, ToolCallFormat, calls_format, json_format
from radixgen.runtime.server.parsers.events import CallArgs, CallRevoked, CallStart, Content, Event, append
from radixgen.runtime.server.parsers.tool_calls import new_call_id

START_MARK, END_MARK = "<|python_start|>", "<|python_end|>"
_WS = " \t\n\r"
_IDENT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# states: before the list, between calls, a call's name, inside its parentheses, a key, a value, after the
# list, plain content
OPENING, LIST, NAME, ARGS, KEY, VALUE, AFTER, PLAIN = range(8)


def py_literal(value: Any) -> str:
    """`value` (JSON data) as a Python literal."""
    if value is True or value is False or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(py_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _value_format(schema: Any) -> dict:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "boolean":
        return {"type": "or", "elements": [{"type": "const_string", "value": v} for v in ("True", "False")]}
    if kind == "null":
        return {"type": "const_string", "value": "None"}
    return json_format(schema)


def _arguments_format(params: dict | None) -> dict | None:
    """Structural-tag element of a call's keyword arguments under `params` (None: no arguments)."""
    props = (params or {}).get("properties") or {}
    required = [k for k in props if k in set((params or {}).get("required") or ())]
    optional = [k for k in props if k not in required]

    def arg(key: str, lead: str) -> dict:
        return {"type": "sequence", "elements": [{"type": "const_string", "value": f"{lead}{key}="},
                                                 _value_format(props[key])]}

    def optional_tail(keys: list[str]) -> list[dict]:
        return [{"type": "optional", "content": arg(k, ", ")} for k in keys]

    if required:
        parts = [arg(k, ", " if i else "") for i, k in enumerate(required)] + optional_tail(optional)
        return {"type": "sequence", "elements": parts}
    if not optional:
        return None
    # no required argument: the first one written has no comma before it
    firsts = [{"type": "sequence", "elements": [arg(k, ""), *optional_tail(optional[i + 1:])]}
              for i, k in enumerate(optional)]
    return {"type": "optional", "content": firsts[0] if len(firsts) == 1 else {"type": "or", "elements": firsts}}


@dataclass(frozen=True)
class PythonicFormat(ToolCallFormat):
    name: str = "pythonic"

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        def one(name: str, args: Any) -> str:
            kw = args.items() if isinstance(args, dict) else []
            return f"{name}(" + ", ".join(f"{k}={py_literal(v)}" for k, v in kw) + ")"

        return "[" + ", ".join(one(n, a) for n, a in calls) + "]"

    def constraint(self, functions: list[tuple[str, dict]], parallel: bool) -> dict:
        tags = []
        for name, params in functions:
            args = _arguments_format(params)
            tags.append({"type": "tag", "begin": f"{name}(", "end": ")",
                         "content": args if args is not None else {"type": "const_string", "value": ""}})
        return calls_format(tags, ", ", parallel, head="[", tail="]")

    def parser(self, functions: Mapping[str, dict | None], max_calls: int | None = None) -> CallParser:
        return PythonicParser(list(functions), max_calls)


def _literal(text: str) -> tuple[bool, Any]:
    """(ok, value) of a Python literal (or a JSON one)."""
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        return True, json.loads(text)
    except ValueError:
        return False, None


class PythonicParser:
    """Parses a pythonic call list into events (see the module docstring)."""

    def __init__(self, names: list[str], max_calls: int | None = None) -> None:
        self.names, self.max_calls = frozenset(names), max_calls
        self.calls = 0
        self.revoked: set[int] = set()
        self.mode = OPENING
        self._out: list[Event] = []
        self._commits = 0  # calls committed (dropped ones past max_calls too)
        self._raw = ""  # the reply's text until the first commit (content if no call commits)
        self._call = ""  # the text since the last call ended: separators and the current call
        self._markup = ""  # the first call's opening text (`[`, a start marker), content again if it is revoked
        self._mark = ""  # a partial <|python_start|> / <|python_end|>
        self._trail = ""  # whitespace after the list (dropped at the end)
        self._index: int | None = None  # the current call's index (None: uncommitted or dropped)
        self._committed = False
        self._token = ""  # the name or key being read
        self._value = ""  # the value being read
        self._args = 0  # arguments sent in the current call
        self._after_call = False  # a `,` or `]` may come
        self._nest: list[str] = []  # open brackets inside a value
        self._quote = ""  # the open string's quote inside a value
        self._escape = False

    def feed(self, text: str) -> list[Event]:
        for ch in text:
            self._char(ch)
        out, self._out = self._out, []
        return out

    def finish(self) -> list[Event]:
        if self.mode in (NAME, ARGS, KEY, VALUE):
            self._fail()
        elif self.mode in (OPENING, LIST) and not self._commits:
            self._content(self._raw + self._mark)
        elif self.mode == AFTER:
            self._content(self._mark)
        self.mode, self._raw, self._call, self._mark = PLAIN, "", "", ""
        out, self._out = self._out, []
        return out

    def _content(self, text: str) -> None:
        if text:
            append(self._out, Content(text))

    def _fail(self) -> None:
        """The call being read is malformed: its text (the whole reply, before any commit) is content,
        and so is everything after it."""
        if self._committed and self._index is not None:
            self.revoked.add(self._index)
            append(self._out, CallRevoked(self._index))
        self._content(self._raw if not self._commits else self._markup + self._call)
        self.mode, self._raw, self._call, self._markup = PLAIN, "", "", ""

    def _char(self, ch: str) -> None:
        if self.mode == PLAIN:
            self._content(ch)
        elif self.mode in (OPENING, AFTER):
            self._outside(ch)
        else:
            self._call += ch
            if not self._commits:
                self._raw += ch
            if self.mode == LIST:
                self._list_char(ch)
            elif self.mode == VALUE:
                self._value_char(ch)
            else:
                self._call_char(ch)

    def _outside(self, ch: str) -> None:
        """Before the list (whitespace, `<|python_start|>`, then `[`) or after it (`<|python_end|>`)."""
        mark = START_MARK if self.mode == OPENING else END_MARK
        if self._mark or ch == "<":
            self._mark += ch
            if mark.startswith(self._mark):
                if self._mark == mark:
                    self._raw += self._mark if self.mode == OPENING else ""
                    self._mark = ""
                return
            ch, self._mark = self._mark, ""
        if self.mode == AFTER and ch in _WS:
            self._trail += ch
        elif self.mode == AFTER:  # whatever follows the list is content
            self.mode = PLAIN
            self._content(self._trail + ch)
        elif ch in _WS:
            self._raw += ch
        elif ch == "[":
            self._raw += ch
            self.mode = LIST
        else:
            self.mode = PLAIN
            self._content(self._raw + ch)
            self._raw = ""

    def _list_char(self, ch: str) -> None:
        if ch in _WS:
            return
        if ch == "," and self._after_call:
            self._after_call = False
        elif ch == "]" and self._after_call:
            self.mode, self._call = AFTER, ""
        elif ch in _IDENT and not self._after_call:
            self._token, self._committed, self._index, self._args = ch, False, None, 0
            self.mode = NAME
        else:
            self._fail()

    def _call_char(self, ch: str) -> None:
        if self.mode == NAME:
            if ch in _IDENT or ch == ".":
                self._token += ch
            elif ch == "(" and self._token in self.names:
                self._commit()
            else:
                self._fail()
        elif self.mode == ARGS:  # before a key (or the closing parenthesis)
            if ch in _WS:
                return
            if ch == ")":
                self._close_call()
            elif ch in _IDENT:
                self._token, self.mode = ch, KEY
            else:
                self._fail()
        else:  # KEY
            if ch in _IDENT:
                self._token += ch
            elif ch == "=":
                self._value, self._nest, self._quote, self._escape, self.mode = "", [], "", False, VALUE
            else:
                self._fail()

    def _commit(self) -> None:
        self._committed = True
        self._commits += 1
        self._markup, self._raw = self._raw[: len(self._raw) - len(self._call)], ""
        if self.max_calls is None or self.calls < self.max_calls:
            self._index = self.calls
            self.calls += 1
            append(self._out, CallStart(self._index, new_call_id(), self._token))
        self.mode = ARGS

    def _value_char(self, ch: str) -> None:
        if self._quote:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == self._quote:
                self._quote = ""
        elif ch in "\"'":
            self._quote = ch
        elif ch in "([{":
            self._nest.append(ch)
        elif ch in ")]}" and self._nest:
            if "([{"[")]}".index(ch)] != self._nest.pop():
                self._fail()
                return
        elif ch in ",)" and not self._nest:  # the value ends
            ok, value = _literal(self._value.strip())
            try:
                text = json.dumps(value, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError):  # a literal JSON has no form of (a set, bytes, nan)
                ok = False
            if not ok:
                self._fail()
                return
            self._send(f'{"{" if not self._args else ", "}{json.dumps(self._token)}: {text}')
            self._args += 1
            if ch == ")":
                self._close_call()
            else:
                self.mode = ARGS
            return
        self._value += ch

    def _send(self, text: str) -> None:
        if self._index is not None:
            append(self._out, CallArgs(self._index, text))

    def _close_call(self) -> None:
        self._send("}" if self._args else "{}")
        self.mode, self._after_call, self._call, self._markup = LIST, True, "", ""
        self._committed, self._index = False, None  # a failure from here on leaves this call done
