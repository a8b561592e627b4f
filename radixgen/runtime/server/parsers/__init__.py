"""Output parsers of the OpenAI chat endpoint: tool calls per model family (JSON objects: tool_formats.py;
mistral.py, pythonic.py, qwen3_coder.py), reasoning, and the JSON scanner they share. Each is a state
machine over the generated text: feeding it the reply in any
split gives the same events (events.py), which a stream sends as deltas and a plain response folds.
"""

from __future__ import annotations

from radixgen.runtime.server.parsers.call_format import CallParser
from radixgen.runtime.server.parsers.choice import ChoiceParser
from radixgen.runtime.server.parsers.events import CallArgs, CallRevoked, CallStart, Content, Event, Reasoning
from radixgen.runtime.server.parsers.reasoning import FORMATS as REASONING_FORMATS
from radixgen.runtime.server.parsers.reasoning import ReasoningFormat, ReasoningParser
from radixgen.runtime.server.parsers.tool_calls import ToolCallParser
from radixgen.runtime.server.parsers.tool_formats import FORMATS as TOOL_FORMATS
from radixgen.runtime.server.parsers.tool_formats import ToolCallFormat, detect_format

TOOL_PARSER_CHOICES = ("auto", *TOOL_FORMATS)  # the `--tool-call-parser` values
REASONING_PARSER_CHOICES = tuple(REASONING_FORMATS)  # the `--reasoning-parser` values


def tool_format_named(name: str | None) -> ToolCallFormat | None:
    """The tool-call format called `name` (None / "auto": the chat template's own, found per request)."""
    if name in (None, "auto"):
        return None
    if name not in TOOL_FORMATS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(TOOL_PARSER_CHOICES)}")
    return TOOL_FORMATS[name]


def reasoning_format_named(name: str | None) -> ReasoningFormat | None:
    """The reasoning format called `name` (None: no reasoning parser)."""
    if name is None:
        return None
    if name not in REASONING_FORMATS:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSER_CHOICES)}")
    return REASONING_FORMATS[name]


__all__ = [
    "REASONING_PARSER_CHOICES", "TOOL_PARSER_CHOICES", "reasoning_format_named", "tool_format_named",
    "REASONING_FORMATS", "TOOL_FORMATS", "CallArgs", "CallParser", "CallRevoked", "CallStart", "ChoiceParser",
    "Content", "Event",
    "Reasoning", "ReasoningFormat", "ReasoningParser", "ToolCallFormat", "ToolCallParser", "detect_format",
]
