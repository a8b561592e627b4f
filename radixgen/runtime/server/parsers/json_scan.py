"""An incremental JSON syntax scanner: one character at a time, with events at value boundaries.

`JsonScanner.step(ch)` checks one character against RFC 8259's grammar (a pushdown automaton: a stack
of open containers plus the position inside the current token) and returns what it completed:

- `Begin(depth, kind)`: a value starts at this character (`kind` is its first character: `{`, `[`,
  `"`, a digit / `-`, `t` / `f` / `n`); `depth` is how many containers enclose it (0 for the root).
- `Key(depth, name)`: an object key ended at this character (`name` decoded); `depth` is the depth of
  the object's member values.
- `End(depth, at_char, text)`: a value ended at this character (`at_char`), or just before it (a
  number ends when the next character cannot continue it); `text` is the decoded string of a string.
- `ERROR`: the character breaks the grammar; the scanner stays failed.

The tool-call parsers use it to find the `name` and `arguments` members of a call object while it is
generated, and to stream the arguments' text as it arrives, never re-parsing what they have seen.
"""

from __future__ import annotations

from dataclasses import dataclass

_WS = " \t\n\r"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_LITERALS = {"t": "true", "f": "false", "n": "null"}
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")


@dataclass(frozen=True)
class Begin:
    depth: int
    kind: str


@dataclass(frozen=True)
class Key:
    depth: int
    name: str


@dataclass(frozen=True)
class End:
    depth: int
    at_char: bool  # the value's last character is this one (False: it ended just before it)
    text: str | None = None


ERROR = "error"
Event = Begin | Key | End | str

# Positions of the scanner (what the next character may be).
VALUE, OBJ_FIRST, OBJ_KEY, COLON, AFTER, ARR_FIRST, STRING, ESCAPE, UNICODE, NUMBER, LITERAL, DONE, FAILED = range(13)

# Number sub-states (RFC 8259's number grammar) and their moves; "d" is any digit but "0", which has
# moves of its own where it differs (a leading zero); the final states may end the number.
_N_START, _N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(9)
_NUMBER_MOVES = {
    (_N_START, "-"): _N_MINUS, (_N_START, "0"): _N_ZERO, (_N_START, "d"): _N_INT,
    (_N_MINUS, "0"): _N_ZERO, (_N_MINUS, "d"): _N_INT,
    (_N_ZERO, "."): _N_DOT, (_N_ZERO, "e"): _N_E, (_N_ZERO, "E"): _N_E,
    (_N_INT, "d"): _N_INT, (_N_INT, "."): _N_DOT, (_N_INT, "e"): _N_E, (_N_INT, "E"): _N_E,
    (_N_DOT, "d"): _N_FRAC, (_N_FRAC, "d"): _N_FRAC, (_N_FRAC, "e"): _N_E, (_N_FRAC, "E"): _N_E,
    (_N_E, "d"): _N_EXP, (_N_E, "+"): _N_ESIGN, (_N_E, "-"): _N_ESIGN, (_N_ESIGN, "d"): _N_EXP,
    (_N_EXP, "d"): _N_EXP,
}
_N_FINAL = frozenset({_N_ZERO, _N_INT, _N_FRAC, _N_EXP})


class JsonScanner:
    """Checks one JSON value character by character (see the module docstring for the events)."""

    def __init__(self) -> None:
        self.stack: list[str] = []  # open containers: "{" or "["
        self.pos = VALUE
        self._is_key = False  # the string being read is an object key
        self._buf: list[str] = []  # decoded characters of the current string
        self._hex = ""  # digits of a \\u escape
        self._num = _N_START
        self._lit = ""  # rest of the literal being read

    @property
    def done(self) -> bool:
        """The root value is complete (only whitespace may follow)."""
        return self.pos == DONE

    def step(self, ch: str) -> list[Event]:
        """Consume one character; returns the events it completed (ERROR once it breaks the grammar)."""
        if self.pos == FAILED:
            return [ERROR]
        events: list[Event] = []
        if self.pos == NUMBER:
            if self._number(ch):
                return events
            if self._num not in _N_FINAL:
                return self._fail(events)
            events.append(End(len(self.stack), False))
            self._after_value()
        self._step(ch, events)
        return events

    # ------------------------------------------------------------------ internals

    def _fail(self, events: list[Event]) -> list[Event]:
        self.pos = FAILED
        events.append(ERROR)
        return events

    def _after_value(self) -> None:
        self.pos = AFTER if self.stack else DONE

    def _begin_value(self, ch: str, events: list[Event]) -> None:
        depth = len(self.stack)
        if ch in "{[":
            events.append(Begin(depth, ch))
            self.stack.append(ch)
            self.pos = OBJ_FIRST if ch == "{" else ARR_FIRST
        elif ch == '"':
            events.append(Begin(depth, ch))
            self._is_key, self._buf, self.pos = False, [], STRING
        elif ch == "-" or ch in _DIGITS:
            events.append(Begin(depth, ch))
            self.pos, self._num = NUMBER, _N_START
            self._number(ch)
        elif ch in _LITERALS:
            events.append(Begin(depth, ch))
            self.pos, self._lit = LITERAL, _LITERALS[ch][1:]
        else:
            self._fail(events)

    def _close(self, ch: str, events: list[Event]) -> None:
        if not self.stack or self.stack[-1] != ("{" if ch == "}" else "["):
            self._fail(events)
            return
        self.stack.pop()
        events.append(End(len(self.stack), True))
        self._after_value()

    def _step(self, ch: str, events: list[Event]) -> None:
        pos = self.pos
        if pos == STRING:
            if ch == '"':
                text = "".join(self._buf)
                if self._is_key:
                    events.append(Key(len(self.stack), text))
                    self.pos = COLON
                else:
                    events.append(End(len(self.stack), True, text))
                    self._after_value()
            elif ch == "\\":
                self.pos = ESCAPE
            elif ch < " ":
                self._fail(events)
            else:
                self._buf.append(ch)
        elif pos == ESCAPE:
            if ch == "u":
                self.pos, self._hex = UNICODE, ""
            elif ch in _ESCAPES:
                self._buf.append(_ESCAPES[ch])
                self.pos = STRING
            else:
                self._fail(events)
        elif pos == UNICODE:
            if ch not in _HEX:
                self._fail(events)
                return
            self._hex += ch
            if len(self._hex) == 4:
                code = int(self._hex, 16)
                if 0xDC00 <= code <= 0xDFFF and self._buf and 0xD800 <= ord(self._buf[-1]) <= 0xDBFF:
                    code = 0x10000 + ((ord(self._buf.pop()) - 0xD800) << 10) + (code - 0xDC00)  # a surrogate pair
                self._buf.append(chr(code))
                self.pos = STRING
        elif pos == LITERAL:
            if not self._lit or ch != self._lit[0]:
                self._fail(events)
                return
            self._lit = self._lit[1:]
            if not self._lit:
                events.append(End(len(self.stack), True))
                self._after_value()
        elif ch in _WS:
            return
        elif pos == VALUE:
            self._begin_value(ch, events)
        elif pos == OBJ_FIRST or pos == OBJ_KEY:
            if ch == '"':
                self._is_key, self._buf, self.pos = True, [], STRING
            elif ch == "}" and pos == OBJ_FIRST:
                self._close(ch, events)
            else:
                self._fail(events)
        elif pos == COLON:
            if ch == ":":
                self.pos = VALUE
            else:
                self._fail(events)
        elif pos == ARR_FIRST:
            if ch == "]":
                self._close(ch, events)
            else:
                self._begin_value(ch, events)
        elif pos == AFTER:
            top = self.stack[-1]
            if ch == ",":
                self.pos = OBJ_KEY if top == "{" else VALUE
            elif ch in "}]":
                self._close(ch, events)
            else:
                self._fail(events)
        else:  # DONE: only whitespace may follow the root value
            self._fail(events)

    def _number(self, ch: str) -> bool:
        """Advance the number sub-state by `ch`; False if `ch` cannot continue the number."""
        nxt = _NUMBER_MOVES.get((self._num, "d" if ch in _DIGITS and ch != "0" else ch))
        if nxt is None and ch == "0":
            nxt = _NUMBER_MOVES.get((self._num, "d"))
        if nxt is None:
            return False
        self._num = nxt
        return True
