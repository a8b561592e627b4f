"""Constrained decoding: JSON schemas / regexes / EBNF / structural tags -> per-token bitmasks.

`schema` turns user input into a `ConstraintSpec`; the engine's `GrammarRouter` sends it to the
first backend (llguidance, XGrammar, outlines-core; `router.py`) that enforces every keyword it uses
(`keywords.py`), compiled once (`GrammarCache`, asynchronous and deduplicated); the backend makes one
`Grammar` matcher per request, which fills that request's row of the batch bitmask each step
(`budget.py` optionally steers it to close the output within max_new_tokens). Backends are imported
lazily (`backend_class`) so `import radixgen` stays fast.
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
from radixgen.grammar.router import FALLBACK_ORDER, GrammarRouter, backend_order
from radixgen.grammar.schema import (
    dtype_spec,
    ebnf_spec,
    json_schema_spec,
    regex_spec,
    response_format_spec,
    spec_from_params,
    structural_tag_spec,
)

BACKENDS = FALLBACK_ORDER  # every backend, in the router's default order


def backend_class(name: str) -> type[GrammarBackend]:
    """The class of the backend called `name` (imports it: the libraries load lazily)."""
    if name == "llguidance":
        from radixgen.grammar.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend
    if name == "xgrammar":
        from radixgen.grammar.xgrammar_backend import XGrammarBackend

        return XGrammarBackend
    if name == "outlines":
        from radixgen.grammar.outlines_backend import OutlinesBackend

        return OutlinesBackend
    raise ValueError(f"unknown grammar backend {name!r}; expected one of {', '.join(BACKENDS)}")


def make_backend(name: str, tokenizer: Any, vocab_size: int | None = None, **kwargs: Any) -> GrammarBackend:
    """The single backend called `name` (one of `BACKENDS`) for `tokenizer` (radixgen Tokenizer)."""
    return backend_class(name)(tokenizer, vocab_size, **kwargs)


def make_router(first: str, tokenizer: Any, vocab_size: int | None = None, **kwargs: Any) -> GrammarRouter:
    """The engine's backend: `first`, falling back through `FALLBACK_ORDER` (see `router.py`)."""
    return GrammarRouter(tokenizer, vocab_size, backend_order(first), **kwargs)


__all__ = [
    "BACKENDS",
    "FALLBACK_ORDER",
    "GrammarRouter",
    "KINDS",
    "CompiledGrammar",
    "ConstraintSpec",
    "Grammar",
    "GrammarBackend",
    "GrammarCache",
    "GrammarError",
    "allocate_bitmask",
    "allowed_token_ids",
    "backend_class",
    "backend_order",
    "bitmask_width",
    "dtype_spec",
    "ebnf_spec",
    "json_schema_spec",
    "make_backend",
    "make_router",
    "regex_spec",
    "response_format_spec",
    "spec_from_params",
    "structural_tag_spec",
]
