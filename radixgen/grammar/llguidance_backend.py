"""The llguidance grammar backend (Microsoft's Low-level Guidance, the engine behind `guidance`).

llguidance compiles JSON schemas, regexes and Lark / GBNF grammars into an Earley parser over a
lexer of lazily built derivative-based automata, and computes a token mask by walking the
tokenizer's byte trie (slices make string-heavy states cheap). It fails loudly on JSON-schema
keywords it does not implement instead of ignoring them, which is what compliance by
construction needs (`keywords.py` lists what it enforces).

- The `LLTokenizer` is built once per backend from the HF tokenizer with the logits width as
  vocabulary size and the engine's EOS ids; special tokens are never allowed inside output. It is
  llguidance's own: it parses the tokenizer's JSON into a second Rust tokenizer (for its
  `tokenize_bytes`), a token trie and the mask slices (Gemma 3's 262k vocabulary: ~2.2 s, 0.2 GB
  held; SmolLM2's 49k: ~0.3 s). `ll_tokenizer` hands it the JSON without the deep copy of the
  tokenizer that `llguidance.hf.from_tokenizer` makes (see there).
- JSON schemas go through `narrow.py` first (our format regexes; objects closed to their listed
  properties unless `extra_properties`).
- A compile builds one template `LLMatcher` (which validates the grammar; an error leaves it in an
  error state, reported as a GrammarError); each request gets a `deep_copy()` of it (~1 us), so the
  lexer and grammar are built once per spec.
- Stop tokens are handled here, not by llguidance: accepting one when the output is complete
  terminates the grammar; llguidance never sees it (it does not count EOS in its rollback).
- `fill_bitmask` writes straight into the batch bitmask row (`unsafe_compute_mask_ptr`, GIL
  released); jump-forward reads llguidance's forced bytes (`compute_ff_bytes`).
- Structural tags (SGLang's `structures` / `triggers` form) become lazy-trigger Lark grammars
  (`llguidance.StructTag`); XGrammar's own `format` form is left to the XGrammar backend.
"""

from __future__ import annotations

import json
import time
from typing import Any

import llguidance
import llguidance.hf
import torch
import transformers

from radixgen.grammar.base import (
    KIND_LABELS,
    CompiledGrammar,
    ConstraintSpec,
    Grammar,
    GrammarBackend,
    GrammarError,
    bitmask_width,
    stop_only_row,
)
from radixgen.grammar.narrow import narrow
from radixgen.grammar.vocab import utf8_prefix

COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
FLEXIBLE = {"whitespace_flexible": True}


def ll_tokenizer(hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for HF tokenizer `hf_tokenizer`, as `llguidance.hf.from_tokenizer` builds it.

    That helper serializes a copy of the Rust tokenizer, made only to turn padding and truncation off
    on it; `copy` goes through a JSON round trip (Gemma 3's 262k vocabulary and 515k merges: ~1.3 s,
    and ~0.13 GB of freed temporaries left in the heap). Without padding or truncation (the engine's
    tokenizers have neither) the original's JSON is the same text, so it is passed as is."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if (not isinstance(hf_tokenizer, transformers.PreTrainedTokenizerFast) or backend is None
            or backend.padding is not None or backend.truncation is not None):
        return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=eos_token_ids)
    return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos_token_ids)


def structural_tag_lark(spec_text: str) -> str:
    """SGLang's `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}` as an llguidance
    grammar: free text in which each trigger starts its tag's `begin`, JSON body and `end`."""
    obj = json.loads(spec_text)
    if "format" in obj:
        raise GrammarError("the llguidance backend takes structural tags in the structures/triggers form only")
    tags = []
    for s in obj["structures"]:
        trigger = next((t for t in obj["triggers"] if s["begin"].startswith(t)), None)
        if trigger is None:
            raise GrammarError(f"structural tag begin {s['begin']!r} starts with none of the triggers")
        tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"], grammar=s["schema"], end=s["end"]))
    return llguidance.StructTag.to_grammar(tags, assume_special=False)


class LLGuidanceBackend(GrammarBackend):
    """Compiles every constraint kind with llguidance (structural tags in SGLang's form)."""

    name = "llguidance"
    kinds = frozenset({"json_schema", "json_object", "regex", "ebnf", "structural_tag"})

    def __init__(self, tokenizer: Any, vocab_size: int | None = None, *, extra_properties: bool = False) -> None:
        self.vocab_size = int(vocab_size or tokenizer.vocab_size)
        self.extra_properties = extra_properties
        self.stop_token_ids = tuple(tokenizer.eos_token_ids)
        self.tokenizer = ll_tokenizer(tokenizer.hf, self.vocab_size, list(self.stop_token_ids))

    @classmethod
    def unsupported(cls, spec: ConstraintSpec) -> str | None:
        if spec.kind == "structural_tag" and "format" in json.loads(spec.spec):
            return "structural tags in XGrammar's format form"
        return super().unsupported(spec)

    def grammar_text(self, spec: ConstraintSpec) -> str:
        """The llguidance grammar (JSON text) a spec stands for; raises GrammarError."""
        ws = FLEXIBLE if spec.any_whitespace else COMPACT
        try:
            if spec.kind == "json_schema":
                schema = narrow(json.loads(spec.spec), self.extra_properties)
                return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=ws)
            if spec.kind == "json_object":
                return llguidance.LLMatcher.grammar_from_json_schema("{}", defaults=ws)
            if spec.kind == "regex":
                return llguidance.LLMatcher.grammar_from_regex(spec.spec)
            if spec.kind == "ebnf":
                return llguidance.grammar_from("ebnf", spec.spec)
            return llguidance.LLMatcher.grammar_from_lark(structural_tag_lark(spec.spec))
        except GrammarError:
            raise
        except Exception as e:  # ValueError (bad JSON / GBNF syntax), KeyError (malformed tag)
            raise GrammarError(f"invalid {KIND_LABELS[spec.kind]} constraint: {_first_line(e)}") from None

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        t0 = time.perf_counter()
        text = self.grammar_text(spec)
        template = llguidance.LLMatcher(self.tokenizer, text, log_level=0)  # validates; errors stay inside
        if template.is_error():
            raise GrammarError(f"invalid {KIND_LABELS[spec.kind]} constraint: {_first_line(template.get_error())}")
        return CompiledGrammar(spec, self.name, template, time.perf_counter() - t0)

    def matcher(self, compiled: CompiledGrammar) -> LLGuidanceGrammar:
        return LLGuidanceGrammar(compiled.handle.deep_copy(), self.stop_token_ids, self.vocab_size)


class LLGuidanceGrammar(Grammar):
    """A per-request llguidance matcher; stop tokens are tracked here (see the module docstring)."""

    def __init__(self, matcher: llguidance.LLMatcher, stop_token_ids: tuple[int, ...], vocab_size: int) -> None:
        self._m = matcher
        self.stop_token_ids = stop_token_ids
        self.vocab_size = vocab_size
        self._row_bytes = 4 * bitmask_width(vocab_size)
        self._accepted = 0  # tokens given to llguidance and not rolled back
        self._done = False

    def accept_token(self, token_id: int) -> bool:
        if self._done:
            return False
        if token_id in self.stop_token_ids:
            self._done = self._m.is_accepting()
            return self._done
        if not 0 <= token_id < self.vocab_size or self._m.try_consume_tokens([token_id]) != 1:
            return False
        self._accepted += 1
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._done:
            stop_only_row(bitmask, row, self.stop_token_ids)
            return
        self._m.unsafe_compute_mask_ptr(bitmask.data_ptr() + row * self._row_bytes, self._row_bytes)

    def can_terminate(self) -> bool:
        return not self._done and self._m.is_accepting()

    def is_terminated(self) -> bool:
        return self._done

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= self._accepted + self._done:
            raise ValueError(f"cannot roll back {num_tokens} tokens; {self._accepted + self._done} accepted")
        if num_tokens and self._done:
            self._done = False
            num_tokens -= 1
        if num_tokens:
            self._m.rollback(num_tokens)
            self._accepted -= num_tokens

    def jump_forward(self) -> str | None:
        if self._done:
            return None
        return utf8_prefix(self._m.compute_ff_bytes()) or None

    def copy(self) -> LLGuidanceGrammar:
        twin = LLGuidanceGrammar(self._m.deep_copy(), self.stop_token_ids, self.vocab_size)
        twin._accepted, twin._done = self._accepted, self._done
        twin.backend_name, twin.warnings = self.backend_name, self.warnings
        return twin


def _first_line(exc: BaseException | str) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
