"""Reasoning parsers: a thinking model's `<think>...</think>` part becomes `reasoning_content`, the rest
`content` (and goes on to the tool-call parser).

- `qwen3`: the reply reasons only if it opens with `<think>` (Qwen3 writes it; with thinking turned
  off its template closes an empty think block in the prompt instead).
- `deepseek_r1`: the reply starts inside the reasoning whether or not it writes `<think>` (DeepSeek-R1
  templates open the tag in the prompt; older ones leave it to the model).

Either way, a prompt that already ends inside an open think tag starts the reply in its reasoning,
and one that ends with a closed think block starts it in the content (`phase_of`). Reasoning is the
text between the tags as written; the whitespace right after `</think>` is dropped from the content.
`constraint` wraps a structural-tag format so that a grammar (response_format, forced tool calls)
applies only after the reasoning ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.runtime.server.parsers.events import Content, Event, Reasoning, append

_WS = " \t\n\r"
START, THINK, AFTER, ANSWER = range(4)  # undecided, reasoning, just after the end tag, content


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str = "<think>"
    end: str = "</think>"
    implicit: bool = False  # the reply starts inside the reasoning even without the start tag

    def phase_of(self, prompt: str) -> str:
        """Where a reply to `prompt` starts: "open" (inside the reasoning), "closed" (after it), or
        "maybe" (it may open the tag itself)."""
        tail = prompt.rstrip()
        if tail.endswith(self.start):
            return "open"
        if tail.endswith(self.end):
            return "closed"
        return "open" if self.implicit else "maybe"

    def constraint(self, inner: dict, phase: str) -> dict:
        """A structural-tag format: free reasoning up to the end tag, then `inner`."""
        if phase == "closed":
            return inner
        think = {"type": "tag", "begin": "" if phase == "open" else self.start, "content": {"type": "any_text"},
                 "end": self.end}
        seq = {"type": "sequence", "elements": [think, {"type": "regex", "pattern": "[ \\n]{0,2}"}, inner]}
        return seq if phase == "open" else {"type": "or", "elements": [seq, inner]}


FORMATS: dict[str, ReasoningFormat] = {f.name: f for f in (
    ReasoningFormat("qwen3"),
    ReasoningFormat("deepseek_r1", implicit=True),
)}


class ReasoningParser:
    """Splits a reply into Reasoning and Content events, incrementally (any split of the text gives the
    same events); `phase` is `ReasoningFormat.phase_of(prompt)`."""

    def __init__(self, fmt: ReasoningFormat, phase: str) -> None:
        self.fmt = fmt
        self.state = ANSWER if phase == "closed" else START
        # where a reply without the start tag goes
        self._then = THINK if phase == "open" or (phase == "maybe" and fmt.implicit) else ANSWER
        self._held = ""  # whitespace and a partial tag not yet sent
        self._out: list[Event] = []

    def feed(self, text: str) -> list[Event]:
        for ch in text:
            self._char(ch)
        out, self._out = self._out, []
        return out

    def finish(self) -> list[Event]:
        if self.state == THINK or (self.state == START and self._then == THINK):
            append(self._out, Reasoning(self._held))
        elif self.state == START:
            append(self._out, Content(self._held))
        self._held = ""
        self.state = ANSWER
        out, self._out = self._out, []
        return out

    def _char(self, ch: str) -> None:
        state, held = self.state, self._held + ch
        if state == ANSWER:
            append(self._out, Content(ch))
        elif state == START:  # leading whitespace, then the start tag or not
            start, head = self.fmt.start, held.lstrip(_WS)
            if head == start:
                self.state, self._held = THINK, ""
            elif start.startswith(head):
                self._held = held
            else:  # no start tag: what was held is read again as reasoning or content
                self.state, self._held = self._then, ""
                for c in held:
                    self._char(c)
        elif state == THINK:  # hold what may be the start of the end tag
            end = self.fmt.end
            if held == end:
                self.state, self._held = AFTER, ""
            elif end.startswith(held):
                self._held = held
            else:
                cut = held.find(end[0], 1)
                while cut != -1 and not end.startswith(held[cut:]):
                    cut = held.find(end[0], cut + 1)
                keep = "" if cut == -1 else held[cut:]
                append(self._out, Reasoning(held[:len(held) - len(keep)]))
                self._held = keep
                if keep == end:
                    self.state, self._held = AFTER, ""
        elif ch not in _WS:  # AFTER: the first character of the answer
            self.state = ANSWER
            append(self._out, Content(ch))
