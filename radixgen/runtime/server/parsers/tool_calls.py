"""Incremental tool-call parsing: generated text in, content and tool-call events out, as it arrives.

`ToolCallParser(fmt, names)` is a state machine over the characters of the reply (never a re-parse
of what it has seen), so feeding the text in any split gives the same events (ids aside):

- TEXT: content. Text that may be the start of the format's open marker is held back, and so is
  whitespace, which is dropped when a call follows (the blank line before `<tool_call>`).
- SECTION: after the marker (or a bare `{` / `[` at the start of the reply, in formats that allow
  it): whitespace, a list's `[` / `]`, separators `,` / `;` between calls, the close marker, or `{`
  opening a call. Anything else ends the section (its text is content if it held no call).
- CALL: a JSON object checked by `JsonScanner`. Its first member must be `name` or the arguments
  (`arguments` / `parameters`, an object). Once `name` is a known tool the call is committed
  (CallStart); from then on the arguments' text streams out as CallArgs fragments as generated
  (arguments written before the name are sent in one fragment). The call ends with its `}`.
- PLAIN: after a committed call broke, everything is content.

Malformed calls never raise. A call that fails before it is committed (unknown name, bad JSON, no
name) is content again, marker included. One that fails after (bad JSON, or the reply ends inside
it) gives CallRevoked and its raw text (with the marker before it) as content: a folded message drops
the call, and a stream, which already sent its start, sends the text as content too. So a reply left
without calls is its own text as content, exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from radixgen.runtime.server.parsers.call_format import ARGS_KEYS, SectionSyntax
from radixgen.runtime.server.parsers.events import CallArgs, CallRevoked, CallStart, Content, Event, append
from radixgen.runtime.server.parsers.json_scan import ERROR, Begin, End, JsonScanner, Key

_WS = " \t\n\r"
TEXT, SECTION, CALL, PLAIN = range(4)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Parses tool calls of `fmt` for the tools `names`; with `max_calls`, later calls are dropped."""

    def __init__(self, fmt: SectionSyntax, names: Sequence[str], max_calls: int | None = None) -> None:
        for marker in (fmt.open, fmt.close):
            # re-scanning only the mismatching character after a partial marker is exact for markers
            # whose first character does not occur again in them
            assert marker is None or marker[0] not in marker[1:], marker
        self.fmt, self.names, self.max_calls = fmt, frozenset(names), max_calls
        self.mode = TEXT
        self.calls = 0  # calls started (their indexes are 0 .. calls - 1)
        self.revoked: set[int] = set()
        self._out: list[Event] = []
        self._at_start = True  # no content and no section yet
        self._ws = ""  # whitespace held in TEXT
        self._marker = ""  # partial marker held (open marker in TEXT, close marker in SECTION)
        self._pending = ""  # section text not yet sent: dropped once a call commits, else content
        self._new_section()
        self._new_call()

    # ------------------------------------------------------------------ public

    def feed(self, text: str) -> list[Event]:
        """Events for the next piece of generated text."""
        for ch in text:
            self._char(ch)
        return self._take()

    def finish(self) -> list[Event]:
        """Events at the end of the reply (held text; a call left open is malformed)."""
        if self.mode == TEXT:
            self._content(self._ws + self._marker if not self.calls else self._marker)
        elif self.mode == SECTION:
            if not self._section_calls:
                self._content(self._pending + self._marker)
        elif self.mode == CALL:
            self._call_failed()
        self.mode = PLAIN
        self._ws = self._marker = self._pending = ""
        return self._take()

    # ------------------------------------------------------------------ states

    def _new_section(self) -> None:
        self._section_calls = 0
        self._list = 0  # 0: no list, 1: inside `[`, 2: after `]`
        self._after_call = False  # a separator may come

    def _new_call(self) -> None:
        self._scan = JsonScanner()
        self._text = ""  # the call's raw text from its `{`
        self._key: str | None = None  # the current member of the call object
        self._first_key = True
        self._committed = False
        self._index: int | None = None  # None while uncommitted, or for a dropped call
        self._args = 0  # 0: not seen, 1: streaming, 2: done
        self._early_args: list[str] = []  # arguments written before the name
        self._markup = ""  # section text before the call, dropped when it committed

    def _take(self) -> list[Event]:
        out, self._out = self._out, []
        return out

    def _content(self, text: str) -> None:
        if text:
            append(self._out, Content(text))

    def _char(self, ch: str) -> None:
        if self.mode == TEXT:
            self._text_char(ch)
        elif self.mode == SECTION:
            self._section_char(ch)
        elif self.mode == CALL:
            self._call_char(ch)
        else:
            self._content(ch)

    def _text_char(self, ch: str) -> None:
        marker = self.fmt.open
        if marker and (self._marker or ch == marker[0]):
            held = self._marker + ch
            if marker.startswith(held):
                self._marker = held
                if held == marker:
                    self._open_section(self._ws + held)
                return
            self._content(self._ws + self._marker)
            self._ws = self._marker = ""
            self._at_start = False
            self._text_char(ch)
        elif ch in _WS:
            self._ws += ch
        elif self._at_start and self.fmt.bare_start and ch in "{[":
            self._open_section(self._ws)
            self._section_char(ch)
        else:
            self._content(self._ws + ch)
            self._ws = ""
            self._at_start = False

    def _open_section(self, text: str) -> None:
        self.mode, self._pending, self._ws, self._marker, self._at_start = SECTION, text, "", "", False
        self._new_section()

    def _section_char(self, ch: str) -> None:
        close = self.fmt.close
        if close and (self._marker or ch == close[0]):
            held = self._marker + ch
            if close.startswith(held):
                self._marker = held
                if held == close:
                    self._end_section(self._pending + held)
                return
            self._leave_section(held)
        elif ch in _WS:
            self._pending += ch
        elif ch == "{" and self._list != 2:
            self._new_call()
            self.mode = CALL
            self._call_char(ch)
        elif ch == "[" and self._list == 0 and not self._section_calls:
            self._list = 1
            self._pending += ch
        elif ch == "]" and self._list == 1 and self._after_call:
            self._list = 2
            self._pending += ch
        elif ch in ",;" and self._after_call and self._list != 2:
            self._after_call = False
            self._pending += ch
        else:
            self._leave_section(ch)

    def _end_section(self, text: str) -> None:
        """The close marker: back to content; a section without calls was content all along."""
        if not self._section_calls:
            self._content(text)
        self.mode, self._pending, self._marker = TEXT, "", ""

    def _leave_section(self, rest: str) -> None:
        """Text that does not belong in a section: the section ends before it."""
        self._end_section(self._pending)
        for ch in rest:
            self._char(ch)

    def _call_char(self, ch: str) -> None:
        self._text += ch
        was_streaming = self._args == 1
        for ev in self._scan.step(ch):
            if ev == ERROR or not self._on_event(ev):
                self._call_failed()
                return
        if was_streaming or self._args == 1:  # the arguments' first, middle or last character
            if self._index is not None:
                append(self._out, CallArgs(self._index, ch))
            elif not self._committed:
                self._early_args.append(ch)
        if self._scan.done:
            self._call_done()

    def _on_event(self, ev: Begin | Key | End) -> bool:
        """Follow the call object's members; False if the call is malformed."""
        if ev.depth != 1:
            return True
        if isinstance(ev, Key):
            if self._first_key and ev.name != "name" and ev.name not in ARGS_KEYS:
                return False
            self._first_key, self._key = False, ev.name
        elif isinstance(ev, Begin):
            if self._key in ARGS_KEYS and self._args == 0:
                if ev.kind != "{":
                    return False
                self._args = 1
        elif self._key == "name" and not self._committed:
            if ev.text is None or ev.text not in self.names:  # not a string, or not one of the tools
                return False
            self._commit(ev.text)
        elif self._key in ARGS_KEYS and self._args == 1:
            self._args = 2
        return True

    def _commit(self, name: str) -> None:
        self._committed = True
        self._markup, self._pending = self._pending, ""
        if self.max_calls is None or self.calls < self.max_calls:
            self._index = self.calls
            self.calls += 1
            append(self._out, CallStart(self._index, new_call_id(), name))
            if self._early_args:
                append(self._out, CallArgs(self._index, "".join(self._early_args)))

    def _call_done(self) -> None:
        if not self._committed:
            self._call_failed()
            return
        if self._args == 0 and self._index is not None:
            append(self._out, CallArgs(self._index, "{}"))
        self._section_calls += 1
        self._after_call = True
        self.mode = SECTION

    def _call_failed(self) -> None:
        if not self._committed:
            self._content(self._pending + self._text)
            self._pending = ""
            self.mode = TEXT
            return
        if self._index is not None:
            self.revoked.add(self._index)
            append(self._out, CallRevoked(self._index))
        self._content(self._markup + self._text)
        self.mode = PLAIN
