"""The engine's grammar backend: routes each constraint to the first backend that enforces it.

Order: the configured backend first, then the rest of `FALLBACK_ORDER`. A JSON schema goes to the
first backend in that order whose coverage (`keywords.COVERAGE`) includes every keyword the schema
uses and that compiles it. With none:
- strict specs (OpenAI `"strict": true`) fail with a GrammarError naming the keywords (a 400);
- otherwise the schema compiles on the backend missing the fewest keywords (order breaks ties) and
  the compiled grammar carries one warning per keyword it does not enforce (response metadata).
Other kinds go to the first backend that supports the kind and compiles the spec (outlines has no
EBNF; llguidance takes structural tags in SGLang's form only; a regex dialect one backend rejects
may compile on the next). If every candidate fails, the first candidate's error is raised.

Why llguidance first (measured here on the SmolLM2 vocabulary with the JSON-Schema-Test-Suite
subset in shared/data, 229 schemas; figures from `tests/grammar/test_grammar_acceptance.py` and
`benchmarks/bench_grammar_compile.py`, see docs/structured_output.md): it rejects every invalid
instance of every schema it compiles (XGrammar accepts 149 invalid ones, outlines-core 10), refuses
keywords it cannot enforce instead of ignoring them, and compiles in ~1 ms. XGrammar is next: it
compiles the most schemas (215 of 229) and fills masks fastest; outlines-core last (99 compiled,
regex-only DFA whose compile time grows with the automaton).

Backends are built lazily, on the first spec that needs them (llguidance ~0.3 s, XGrammar ~1 s,
outlines-core ~1 s for a 49k vocabulary; llguidance ~2.5 s for Gemma 3's 262k), and their modules
(and libraries: XGrammar's import takes ~0.15 s and 20 MB) imported only when a spec gets to them: a
schema the first backend enforces and compiles loads no other. A build parses the vocabulary on a
compile thread, whose heap glibc keeps after the parse's temporaries are freed (~0.3 GB for
llguidance at 262k tokens): the router gives those pages back to the OS once the backend is built.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import replace
from itertools import chain
from typing import Any

from radixgen.common.heap import release_free_memory
from radixgen.grammar.base import CompiledGrammar, ConstraintSpec, Grammar, GrammarBackend, GrammarError
from radixgen.grammar.keywords import COVERAGE

FALLBACK_ORDER = ("llguidance", "xgrammar", "outlines")


def backend_order(first: str) -> tuple[str, ...]:
    """`first`, then the other backends in `FALLBACK_ORDER`."""
    if first not in FALLBACK_ORDER:
        raise ValueError(f"unknown grammar backend {first!r}; expected one of {', '.join(FALLBACK_ORDER)}")
    return (first, *(n for n in FALLBACK_ORDER if n != first))


def unenforced_warnings(backend: str, schema: Any) -> tuple[str, ...]:
    """One message per keyword use of `schema` that `backend` would not enforce."""
    return tuple(f"JSON schema keyword {use.describe()} is {why} by the {backend} grammar backend: outputs may "
                 "violate it" for use, why in COVERAGE[backend].unenforced(schema))


class GrammarRouter(GrammarBackend):
    """A GrammarBackend over several backends (see the module docstring)."""

    name = "router"

    def __init__(self, tokenizer: Any, vocab_size: int | None = None, order: tuple[str, ...] = FALLBACK_ORDER,
                 **backend_kwargs: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size or tokenizer.vocab_size)
        self.stop_token_ids = tuple(tokenizer.eos_token_ids)
        self.order = tuple(order)
        self._kwargs = backend_kwargs
        self._backends: dict[str, GrammarBackend] = {}
        self._completer: Any = None  # budget.ShortestCompletion, built for the first budget-aware request
        self._lock = threading.Lock()

    @property
    def primary(self) -> str:
        return self.order[0]

    def backend(self, name: str) -> GrammarBackend:
        """The backend called `name`, built on first use (then the heap its build freed is trimmed)."""
        with self._lock:
            if name not in self._backends:
                from radixgen.grammar import make_backend

                self._backends[name] = make_backend(name, self.tokenizer, self.vocab_size, **self._kwargs)
                release_free_memory()
            return self._backends[name]

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        if spec.kind != "json_schema":
            return self._first_that_compiles(spec, (n for n in self.order if self._takes(n, spec)))
        schema = json.loads(spec.spec)
        warned = {n: unenforced_warnings(n, schema) for n in self.order}
        # backends are imported (by `_takes`) only as far as the first exact one that compiles
        exact = (n for n in self.order if not warned[n] and self._takes(n, spec))
        errors: list[GrammarError] = []
        first_exact = next(exact, None)
        if first_exact is not None:
            try:
                return self._first_that_compiles(spec, chain((first_exact,), exact))
            except GrammarError as e:
                errors.append(e)
        missing = {n: warned[n] for n in self.order if self._takes(n, spec)}
        if spec.strict:  # a compile error of an exact backend is the schema's own fault: report it
            from radixgen.grammar.schema import strict_violation

            raise errors[0] if errors else GrammarError(strict_violation(schema, tuple(missing)))
        rest = sorted((n for n in missing if missing[n]), key=lambda n: (len(missing[n]), self.order.index(n)))
        if not rest:
            raise errors[0]
        try:
            name_compiled = self._first_that_compiles(spec, rest)
        except GrammarError as e:
            raise errors[0] if errors else e from None
        return replace(name_compiled, warnings=missing[name_compiled.backend])

    def _takes(self, name: str, spec: ConstraintSpec) -> bool:
        """Whether backend `name` supports the spec's kind and form (without building it)."""
        from radixgen.grammar import backend_class

        return backend_class(name).unsupported(spec) is None

    def _first_that_compiles(self, spec: ConstraintSpec, names: Iterable[str]) -> CompiledGrammar:
        first_error: GrammarError | None = None
        for name in names:
            try:
                return self.backend(name).compile(spec)
            except GrammarError as e:
                first_error = first_error or e
        if first_error is None:
            raise GrammarError(f"no grammar backend ({', '.join(self.order)}) supports {spec.kind} constraints "
                               "in this form")
        raise first_error

    def matcher(self, compiled: CompiledGrammar, *, budget: int | None = None) -> Grammar:
        """A per-request matcher from the backend that compiled it, labelled with that backend and the
        compile's warnings. With `budget` (the request's max_new_tokens, budget-aware mode) it is
        wrapped to close the output within it; GrammarError if no output fits that budget."""
        g = self.backend(compiled.backend).matcher(compiled)
        g.backend_name, g.warnings = compiled.backend, compiled.warnings
        if budget is None:
            return g
        from radixgen.grammar.budget import BudgetAwareGrammar, ShortestCompletion

        with self._lock:
            if self._completer is None:
                self._completer = ShortestCompletion(self.tokenizer, self.vocab_size)
        return BudgetAwareGrammar(g, self._completer, budget)
