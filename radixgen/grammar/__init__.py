"""Constrained decoding: JSON schemas / regexes / EBNF / structural tags -> per-token bitmasks.

`schema` turns user input into a `ConstraintSpec`; a `GrammarBackend` (XGrammar by default, or
outlines-core) compiles it once (`GrammarCache`, asynchronous and deduplicated) and makes one
`Grammar` matcher per request, which fills that request's row of the batch bitmask each step.
Backends are imported lazily (`make_backend`) so `import radixgen` stays fast.
"""

from __future__ import annotations

from typing import Any

from radixgen.grammar.base import (
    KINDS,
    CompiledGrammar,
    ConstraintSpec,
    Grammar,
    GrammarBackend,
    GrammarError,
    allocate_bitmask,
    allowed_token_ids,
    bitmask_width,
)
from radixgen.grammar.compiler_cache import GrammarCache
from radixgen.grammar.schema import (
    dtype_spec,
    ebnf_spec,
    json_schema_spec,
    regex_spec,
    response_format_spec,
    spec_from_params,
    structural_tag_spec,
)

BACKENDS = ("xgrammar", "outlines")


def make_backend(name: str, tokenizer: Any, vocab_size: int | None = None, **kwargs: Any) -> GrammarBackend:
    """The backend called `name` ("xgrammar" | "outlines") for `tokenizer` (radixgen Tokenizer)."""
    if name == "xgrammar":
        from radixgen.grammar.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, **kwargs)
    if name == "outlines":
        from radixgen.grammar.outlines_backend import OutlinesBackend

        return OutlinesBackend(tokenizer, vocab_size, **kwargs)
    raise ValueError(f"unknown grammar backend {name!r}; expected one of {', '.join(BACKENDS)}")


__all__ = [
    "BACKENDS",
    "KINDS",
    "CompiledGrammar",
    "ConstraintSpec",
    "Grammar",
    "GrammarBackend",
    "GrammarCache",
    "GrammarError",
    "allocate_bitmask",
    "allowed_token_ids",
    "bitmask_width",
    "dtype_spec",
    "ebnf_spec",
    "json_schema_spec",
    "make_backend",
    "regex_spec",
    "response_format_spec",
    "spec_from_params",
    "structural_tag_spec",
]
