"""What the output parsers make of generated text: pieces of content, of reasoning, and tool calls.

A parser turns text deltas into a list of these events; a streaming response sends each one as a
delta, a non-streaming one folds them into one message, so both answer the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Content:
    """Text of the answer (`content`)."""

    text: str


@dataclass(frozen=True)
class Reasoning:
    """Text of the model's reasoning (`reasoning_content`), kept out of `content`."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """A tool call begins: its index in this choice, its id and the function's name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    """A fragment of a tool call's `arguments` text, as generated."""

    index: int
    text: str


@dataclass(frozen=True)
class CallRevoked:
    """A started call turned out malformed (broken JSON, or the output ended inside it). A Content event
    with the call's raw text follows; a folded message drops the call, a stream cannot take it back."""

    index: int


Event = Content | Reasoning | CallStart | CallArgs | CallRevoked


def append(out: list[Event], ev: Event) -> None:
    """Append `ev`, merging it into the last event when both are text of the same kind (and call)."""
    last = out[-1] if out else None
    if isinstance(ev, (Content, Reasoning)) and type(last) is type(ev):
        out[-1] = type(ev)(last.text + ev.text)  # type: ignore[union-attr]
    elif isinstance(ev, CallArgs) and isinstance(last, CallArgs) and last.index == ev.index:
        out[-1] = CallArgs(ev.index, last.text + ev.text)
    elif not isinstance(ev, (Content, Reasoning, CallArgs)) or ev.text:
        out.append(ev)
