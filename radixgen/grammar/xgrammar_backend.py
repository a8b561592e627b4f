"""The XGrammar grammar backend (Dong et al., "XGrammar: Flexible and Efficient Structured
Generation Engine for Large Language Models", 2024).

XGrammar compiles JSON schemas, regexes, EBNF and structural tags into a pushdown automaton with a
precomputed per-state token-mask cache, so filling a bitmask row is cheap. The `TokenizerInfo` is
built once per backend from the HF tokenizer, with the model's logits width as vocab size and the
engine's EOS ids as stop tokens. Special tokens other than the stop tokens (`<|endoftext|>`,
`<|im_start|>`, `<repo_name>`, ...) are blanked in the vocabulary handed to XGrammar, so it never
allows them inside constrained output (by default XGrammar would treat them as their literal text).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import torch
import xgrammar as xgr

from radixgen.grammar.base import (
    KIND_LABELS,
    CompiledGrammar,
    ConstraintSpec,
    Grammar,
    GrammarBackend,
    GrammarError,
    stop_only_row,
)
from radixgen.grammar.narrow import lower_formats

_XGR_PREFIX = re.compile(r"^\[[\d:.]+\] \S+?:\d+: (Check failed: \(.*?\) is false: )?")


def clean_error(exc: BaseException) -> str:
    """XGrammar's C++ message without its timestamp / source-location / check prefix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _XGR_PREFIX.sub("", text)


def build_tokenizer_info(hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> xgr.TokenizerInfo:
    """XGrammar's view of the vocabulary: raw tokens by id, specials blanked except stop tokens."""
    encoded = [""] * vocab_size
    for token, idx in hf_tokenizer.get_vocab().items():
        if idx < vocab_size:
            encoded[idx] = token
    stops = set(stop_token_ids)
    for idx, added in getattr(hf_tokenizer, "added_tokens_decoder", {}).items():
        if added.special and idx not in stops and idx < vocab_size:
            encoded[idx] = ""  # XGrammar treats empty tokens as special: never allowed
    probe = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    return xgr.TokenizerInfo(
        encoded,
        probe.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=list(stop_token_ids),
        add_prefix_space=probe.add_prefix_space,
    )


def structural_tag_object(spec_text: str) -> xgr.StructuralTag:
    """Parse a structural-tag spec: `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`
    (SGLang's form), or XGrammar's own `{"type": "structural_tag", "format": {...}}`."""
    try:
        obj = json.loads(spec_text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"structural_tag spec is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise GrammarError("structural_tag spec must be a JSON object")
    if "format" in obj:
        return xgr.StructuralTag.from_json(obj)
    structures, triggers = obj.get("structures"), obj.get("triggers")
    if not isinstance(structures, list) or not structures or not isinstance(triggers, list) or not triggers:
        raise GrammarError("structural_tag spec needs non-empty 'structures' and 'triggers' lists")
    items = []
    for i, s in enumerate(structures):
        if not isinstance(s, dict) or not {"begin", "schema", "end"} <= s.keys():
            raise GrammarError(f"structural_tag structures[{i}] needs 'begin', 'schema' and 'end'")
        items.append(xgr.StructuralTagItem(begin=s["begin"], schema=s["schema"], end=s["end"]))
    return xgr.StructuralTag.from_legacy_structural_tag(items, triggers)


class XGrammarBackend(GrammarBackend):
    """Compiles every constraint kind with XGrammar; the compiler keeps its own cache too.

    extra_properties: JSON Schema's semantics for objects and arrays (keys / items beyond those
        listed allowed unless forbidden) instead of XGrammar's strict mode (none unless the schema
        allows them explicitly; the default, as it keeps generated objects on-schema).
    JSON schemas get our format regexes first (`narrow.lower_formats`).
    """

    name = "xgrammar"

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None = None,
        *,
        extra_properties: bool = False,
        max_threads: int = 1,
    ) -> None:
        self.vocab_size = int(vocab_size or tokenizer.vocab_size)
        self.stop_token_ids = tuple(tokenizer.eos_token_ids)
        self.strict_mode = not extra_properties
        self.tokenizer_info = build_tokenizer_info(tokenizer.hf, self.vocab_size, list(self.stop_token_ids))
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=max_threads)

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        t0 = time.perf_counter()
        try:
            handle = self._compile(spec)
        except GrammarError:
            raise
        except Exception as e:  # XGrammar raises RuntimeError / ValueError / pydantic errors
            raise GrammarError(f"invalid {KIND_LABELS[spec.kind]} constraint: {clean_error(e)}") from None
        return CompiledGrammar(spec, self.name, handle, time.perf_counter() - t0)

    def _compile(self, spec: ConstraintSpec) -> xgr.CompiledGrammar:
        c = self.compiler
        if spec.kind == "json_schema":
            return c.compile_json_schema(
                json.dumps(lower_formats(json.loads(spec.spec))),
                any_whitespace=spec.any_whitespace,
                separators=None if spec.any_whitespace else (",", ":"),
                strict_mode=self.strict_mode,
            )
        if spec.kind == "json_object":
            return c.compile_builtin_json_grammar()
        if spec.kind == "regex":
            return c.compile_regex(spec.spec)
        if spec.kind == "ebnf":
            return c.compile_grammar(spec.spec, root_rule_name="root")
        return c.compile_structural_tag(structural_tag_object(spec.spec))

    def matcher(self, compiled: CompiledGrammar) -> XGrammarGrammar:
        return XGrammarGrammar(xgr.GrammarMatcher(compiled.handle), self.stop_token_ids, self.vocab_size)


class XGrammarGrammar(Grammar):
    """A per-request XGrammar matcher (XGrammar keeps the token history for rollback)."""

    def __init__(self, matcher: xgr.GrammarMatcher, stop_token_ids: tuple[int, ...], vocab_size: int) -> None:
        self._m = matcher
        self.stop_token_ids = stop_token_ids
        self.vocab_size = vocab_size
        self._accepted = 0  # tokens accepted and not rolled back (XGrammar refuses rolling back more)
        self._done = False  # a stop token was accepted (mirrors is_terminated() without the FFI call)

    def accept_token(self, token_id: int) -> bool:
        if self._done or not 0 <= token_id < self.vocab_size:
            return False
        if not self._m.accept_token(token_id):
            return False
        self._accepted += 1
        self._done = token_id in self.stop_token_ids
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._done:  # XGrammar refuses; allow only the stop tokens so the row stays valid
            stop_only_row(bitmask, row, self.stop_token_ids)
            return
        self._m.fill_next_token_bitmask(bitmask, row)

    def can_terminate(self) -> bool:
        return not self._done and self._m.is_completed()

    def is_terminated(self) -> bool:
        return self._done

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self._accepted:
            raise ValueError(f"cannot roll back {num_tokens} tokens; {self._accepted} accepted")
        if num_tokens:
            self._m.rollback(num_tokens)
            self._accepted -= num_tokens
            self._done = False  # a stop token can only have been the last one

    def jump_forward(self) -> str | None:
        if self._done:
            return None
        return self._m.find_jump_forward_string() or None

    def copy(self) -> XGrammarGrammar:
        twin = XGrammarGrammar(self._m.fork(), self.stop_token_ids, self.vocab_size)
        twin._accepted, twin._done = self._accepted, self._done
        twin.backend_name, twin.warnings = self.backend_name, self.warnings
        return twin
