"""What every tool-call format provides (`ToolCallFormat`), and what its incremental parser does
(`CallParser`). The formats themselves: tool_formats.py (the JSON-object families), mistral.py,
pythonic.py, qwen3_coder.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from radixgen.runtime.server.parsers.events import Event

ARGS_KEYS = ("arguments", "parameters")  # the member holding a call's arguments, in every JSON format


class CallParser(Protocol):
    """An incremental parser of one reply's tool calls (see tool_calls.py for the contract: any split of
    the text gives the same events; malformed calls become content, never an exception)."""

    calls: int  # calls started (their indexes are 0 .. calls - 1)
    revoked: set[int]  # indexes of started calls that turned out malformed

    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class SectionSyntax(Protocol):
    """What tool_calls.py's parser reads of a format whose calls are JSON objects in marked sections."""

    open: str | None  # marker opening a section of calls
    close: str | None  # marker closing it (None: the section runs to the end of the calls)
    bare_start: bool  # a reply that starts with `{` or `[` opens a section without the marker


class ToolCallFormat:
    """One family's tool-call syntax: how calls are written, described, forced and parsed."""

    name: str

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        """The text of an assistant turn making these (name, arguments) calls."""
        raise NotImplementedError

    def constraint(self, functions: list[tuple[str, dict]], parallel: bool) -> dict:
        """An XGrammar structural-tag format forcing one or more calls (one if not `parallel`) of these
        (name, parameters schema) functions, in this syntax."""
        raise NotImplementedError

    def parser(self, functions: Mapping[str, dict | None], max_calls: int | None = None) -> CallParser:
        """A parser of calls to `functions` (name -> parameters schema); with `max_calls`, later calls
        are dropped."""
        raise NotImplementedError

    def for_template(self, chat_template: str | None) -> ToolCallFormat:
        """The variant of this format a chat template writes (most formats have one)."""
        return self

    def instructions(self, functions: list[dict], parallel: bool) -> str:
        """A system-prompt paragraph describing the tools, for templates that do not render them."""
        arg = {"<argument>": "<value>"}
        example = self.render_calls([("<function name>", arg)])
        several = ""
        if parallel:
            two = self.render_calls([("<function name>", arg), ("<another function>", arg)])
            several = f"To make several calls at once, write:\n{two}\n"
        specs = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
        return (f"You can call the functions below. To call one, reply with only:\n{example}\n{several}"
                f"Functions (JSON Schema):\n<tools>\n{specs}\n</tools>")


def json_format(schema: Any) -> dict:
    """A structural-tag element for JSON matching `schema`; at most one whitespace character in a row
    (JSON's own spacing, without letting a model pad output with endless blanks)."""
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}


def calls_format(tags: list[dict], separator: str, parallel: bool, head: str = "", tail: str = "") -> dict:
    """One or more of `tags` (one if not `parallel`) between `separator`s, after `head`, before `tail`."""
    calls = {"type": "tags_with_separator", "tags": tags, "separator": separator, "at_least_one": True,
             "stop_after_first": not parallel}
    parts = [{"type": "const_string", "value": head}] if head else []
    parts += [calls] + ([{"type": "const_string", "value": tail}] if tail else [])
    return calls if len(parts) == 1 else {"type": "sequence", "elements": parts}
