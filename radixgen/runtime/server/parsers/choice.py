"""One choice's reply through the parsers: reasoning first, then tool calls in what is content."""

from __future__ import annotations

from radixgen.runtime.server.parsers.call_format import CallParser
from radixgen.runtime.server.parsers.events import Content, Event, append
from radixgen.runtime.server.parsers.reasoning import ReasoningParser


class ChoiceParser:
    """Chains a reasoning parser and a tool-call parser (either may be None) over a reply's text."""

    def __init__(self, reasoning: ReasoningParser | None, tools: CallParser | None) -> None:
        self.reasoning, self.tools = reasoning, tools

    @property
    def revoked(self) -> set[int]:
        """Indexes of tool calls that turned out malformed."""
        return self.tools.revoked if self.tools is not None else set()

    def feed(self, text: str) -> list[Event]:
        """Events for the next piece of the reply."""
        return self._chain(self.reasoning.feed(text) if self.reasoning is not None else [Content(text)], False)

    def finish(self) -> list[Event]:
        """Events at the end of the reply."""
        return self._chain(self.reasoning.finish() if self.reasoning is not None else [], True)

    def _chain(self, events: list[Event], final: bool) -> list[Event]:
        if self.tools is None:
            return [e for e in events if not isinstance(e, Content) or e.text]
        out: list[Event] = []
        for ev in events:
            for e in (self.tools.feed(ev.text) if isinstance(ev, Content) else [ev]):
                append(out, e)
        if final:
            for e in self.tools.finish():
                append(out, e)
        return out
