"""Deterministic-continuation detection for regex grammars (jump-forward decoding).

SGLang's compressed-FSM idea (Zheng et al., "SGLang: Efficient Execution of Structured Language
Model Programs", 2024): when the character automaton of the constraint has, from the current state,
exactly one possible next character (and the state is not accepting, so stopping is no
alternative), that character is forced; following such states yields a string the engine can append
without sampling. The automaton here is interegular's character FSM of the regex (Python `re`
syntax; patterns it cannot parse simply get no jump-forward). Tokens are bytes, so a token may end
inside a multi-byte UTF-8 character: `RegexJumpForward.advance` carries the incomplete bytes along.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import interegular
from interegular.fsm import anything_else

MAX_JUMP_CHARS = 4096  # a forced run longer than this is cut (it is found again next step)


@dataclass(frozen=True)
class CharState:
    """Position in the character FSM: FSM state (None: left the language) + pending UTF-8 bytes."""

    state: int | None
    pending: bytes = b""


class RegexJumpForward:
    """The character FSM of one regex with the analysis jump-forward needs (built once, shared)."""

    def __init__(self, pattern: str) -> None:
        fsm = interegular.parse_pattern(pattern).to_fsm()
        self._alphabet = fsm.alphabet
        self._map: dict[int, dict[int, int]] = fsm.map
        self._finals = frozenset(fsm.finals)
        self.initial = CharState(fsm.initial)
        # live states: those from which an accepting state is reachable (reverse BFS)
        reverse: dict[int, set[int]] = {}
        for src, edges in self._map.items():
            for dst in edges.values():
                reverse.setdefault(dst, set()).add(src)
        live, todo = set(self._finals), deque(self._finals)
        while todo:
            for src in reverse.get(todo.popleft(), ()):
                if src not in live:
                    live.add(src)
                    todo.append(src)
        self._live = frozenset(live)
        # symbol -> its single character, for symbols that stand for exactly one character
        self._single: dict[int, str] = {}
        for symbol, chars in self._alphabet.by_transition.items():
            if len(chars) == 1 and chars[0] is not anything_else:
                self._single[symbol] = chars[0]

    @classmethod
    def try_build(cls, pattern: str) -> RegexJumpForward | None:
        """Build the analysis, or None when interegular cannot handle the pattern."""
        try:
            return cls(pattern)
        except Exception:  # interegular raises InvalidSyntax / Unsupported / others on exotic syntax
            return None

    def advance(self, pos: CharState, data: bytes) -> CharState:
        """Feed the bytes of one token; complete UTF-8 characters move the FSM."""
        if pos.state is None:
            return pos
        buf = pos.pending + data
        text, pending = _decode_prefix(buf)
        state: int | None = pos.state
        for ch in text:
            state = self._map.get(state, {}).get(self._alphabet[ch])
            if state is None:
                break
        return CharState(state, pending)

    def is_accepting(self, pos: CharState) -> bool:
        return pos.state in self._finals and not pos.pending

    def forced_string(self, pos: CharState) -> str:
        """The longest string that every accepted continuation from `pos` starts with ("" if none)."""
        if pos.state is None or pos.pending:
            return ""
        out: list[str] = []
        state = pos.state
        while state not in self._finals and len(out) < MAX_JUMP_CHARS:
            edges = [(sym, dst) for sym, dst in self._map.get(state, {}).items() if dst in self._live]
            if len(edges) != 1 or edges[0][0] not in self._single:
                break
            out.append(self._single[edges[0][0]])
            state = edges[0][1]
        return "".join(out)


def _decode_prefix(buf: bytes) -> tuple[str, bytes]:
    """Decode the longest UTF-8 prefix of `buf`; return it and the incomplete tail (<= 3 bytes)."""
    for cut in range(0, min(4, len(buf) + 1)):
        head = buf[: len(buf) - cut]
        try:
            return head.decode("utf-8"), buf[len(buf) - cut :]
        except UnicodeDecodeError:
            continue
    return buf.decode("utf-8", errors="replace"), b""
