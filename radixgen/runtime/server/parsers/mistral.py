"""Mistral's tool calls, after the `[TOOL_CALLS]` marker (a control token in Mistral's vocabularies),
in either of the two forms its models write (SGLang's `mistral` parser reads both):

- JSON list (Mistral 7B v0.3, Mixtral, Nemo): `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`;
- compact (tokenizer v11+: Mistral Small 3.2, Magistral, Devstral): `[TOOL_CALLS]name[ARGS]{...}`, the
  marker again before each further call.

The parser is the JSON-object parser (tool_calls.py) with one more path after the marker: a name
instead of `{` / `[` reads the compact form, committed once `[ARGS]` follows a known name, its
arguments streamed as generated. Calls are written (past turns, forced calls) in the form the chat
template uses: compact when it mentions `[ARGS]`, else the JSON list.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixgen.runtime.server.parsers.call_format import CallParser, ToolCallFormat, calls_format, json_format
from radixgen.runtime.server.parsers.events import CallArgs, Event, append
from radixgen.runtime.server.parsers.json_scan import ERROR, Begin
from radixgen.runtime.server.parsers.tool_calls import TEXT, ToolCallParser

MARKER, ARGS_MARKER = "[TOOL_CALLS]", "[ARGS]"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
NAME, ARGS_TAG, ARGS = 10, 11, 12  # the compact form's states (beside tool_calls.py's)


@dataclass(frozen=True)
class MistralFormat(ToolCallFormat):
    compact: bool  # write `[TOOL_CALLS]name[ARGS]{...}` (else the JSON list)
    name: str = "mistral"
    open: str = MARKER  # what tool_calls.py's parser reads
    close: str | None = None
    bare_start: bool = False

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        if self.compact:
            return "".join(f"{MARKER}{n}{ARGS_MARKER}{json.dumps(a, ensure_ascii=False)}" for n, a in calls)
        objs = (json.dumps({"name": n, "arguments": a}, ensure_ascii=False) for n, a in calls)
        return f"{MARKER} [" + ", ".join(objs) + "]"

    def constraint(self, functions: list[tuple[str, dict]], parallel: bool) -> dict:
        if self.compact:
            tags = [{"type": "tag", "begin": f"{MARKER}{name}{ARGS_MARKER}", "content": json_format(params), "end": ""}
                    for name, params in functions]
            return calls_format(tags, "", parallel)
        tags = [{"type": "tag", "begin": f'{{"name": {json.dumps(name)}, "arguments": ', "content": json_format(params),
                 "end": "}"} for name, params in functions]
        return calls_format(tags, ", ", parallel, head=f"{MARKER} [", tail="]")

    def parser(self, functions: Mapping[str, dict | None], max_calls: int | None = None) -> CallParser:
        return MistralParser(self, list(functions), max_calls)

    def for_template(self, chat_template: str | None) -> MistralFormat:
        return MistralFormat(compact=ARGS_MARKER in (chat_template or ""))


class MistralParser(ToolCallParser):
    """tool_calls.py's parser over `[TOOL_CALLS]` sections, which also reads the compact form."""

    def _new_call(self) -> None:
        super()._new_call()
        self._name = ""  # the compact form's function name
        self._tag = ""  # the part of `[ARGS]` read so far

    def _char(self, ch: str) -> None:
        if self.mode in (NAME, ARGS_TAG, ARGS):
            self._compact_char(ch)
        else:
            super()._char(ch)

    def _section_char(self, ch: str) -> None:
        if ch in _NAME_CHARS and not self._section_calls and not self._list and not self._marker:
            self._new_call()
            self.mode = NAME
            self._compact_char(ch)
        else:
            super()._section_char(ch)

    def _compact_char(self, ch: str) -> None:
        self._text += ch
        if self.mode == NAME:
            if ch in _NAME_CHARS:
                self._name += ch
            elif ch == "[":
                self.mode, self._tag = ARGS_TAG, ch
            else:
                self._call_failed()
        elif self.mode == ARGS_TAG:
            self._tag += ch
            if not ARGS_MARKER.startswith(self._tag):
                self._call_failed()
            elif self._tag == ARGS_MARKER:
                if self._name not in self.names:
                    self._call_failed()
                    return
                self._commit(self._name)
                self.mode = ARGS
        else:
            self._args_char(ch)

    def _args_char(self, ch: str) -> None:
        events = self._scan.step(ch)
        started = self._args == 1 or any(isinstance(e, Begin) for e in events)
        if ch in " \t\n\r" and not started:  # before the object
            return
        if ERROR in events or any(isinstance(e, Begin) and e.depth == 0 and e.kind != "{" for e in events):
            self._call_failed()
            return
        self._args = 1
        if self._index is not None:
            append(self._out, CallArgs(self._index, ch))
        if self._scan.done:
            self._section_calls += 1
            self.mode = TEXT  # the marker opens the next call

    def finish(self) -> list[Event]:
        if self.mode in (NAME, ARGS_TAG, ARGS):
            self._call_failed()
        return super().finish()

