"""Stop regexes (SGLang's `stop_regex` sampling field): where a growing output should be cut.

The engine stops on strings and token ids; a regex stop is applied by whoever streams the output
(the language's Engine backend, the native `/generate` route): feed it the text so far after each
chunk, and once a pattern matches, cut the text at the end of the match and abort the request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    end: int  # the output keeps text[:end]
    pattern: str


class StopRegex:
    """One or more compiled stop patterns; `match(text)` is the earliest-ending match or None."""

    def __init__(self, patterns: str | Sequence[str]) -> None:
        pats = [patterns] if isinstance(patterns, str) else list(patterns)
        self.compiled: list[re.Pattern] = []
        for p in pats:
            if not isinstance(p, str) or not p:
                raise ValueError(f"stop_regex must be a non-empty regex or a list of them, got {p!r}")
            try:
                self.compiled.append(re.compile(p))
            except re.error as e:
                raise ValueError(f"invalid stop_regex {p!r}: {e}") from None

    @classmethod
    def from_param(cls, value: str | Sequence[str] | None) -> StopRegex | None:
        """None for an absent or empty value (SGLang's client always sends `stop_regex: []`)."""
        if value is None or (not isinstance(value, str) and len(value) == 0):
            return None
        return cls(value)

    def match(self, text: str) -> StopMatch | None:
        best: StopMatch | None = None
        for p in self.compiled:
            m = p.search(text)
            if m is not None and (best is None or m.end() < best.end):
                best = StopMatch(m.end(), p.pattern)
        return best
