"""The alternative grammar backend: outlines-core regex indexes (Willard & Louf, "Efficient Guided
Generation for Large Language Models", 2023).

JSON schemas become regexes (`outlines_core.json_schema.build_regex_from_schema`); a regex becomes
an `Index`: the regex DFA lifted to tokens, i.e. for each DFA state the allowed token ids and their
next states. The `Vocabulary` is built once per backend from the HF tokenizer; byte-level BPE token
strings (GPT-2's byte-to-unicode alphabet, `Ġ` = space) are mapped back to the bytes they stand for.

Measured on outlines-core 0.2.14, and shaping this file:
- Its index drops token transitions that leave an accepting DFA state towards a non-accepting one:
  with the bare regex `(0|[1-9][0-9]*)(\\.[0-9]+)?`, "10.5" is rejected after "10", and `(ab)+`
  stops after the first "ab". We therefore index `(?:regex)` followed by a sentinel character
  (U+10FFFF) carried by one fake token id (= vocab_size, outside the logits). Before the sentinel no
  state accepts, so no transition is lost; "the output may end here" is "the fake token is allowed",
  and the EOS bits are set from that. Real tokens containing byte 0xF4 (which only starts code points
  U+100000.. U+10FFFF, a private-use plane) are left out so that no real token can spell the sentinel.
- Building an Index costs ~40 ms for a typical tool-call schema with the 49k SmolLM2 vocabulary
  (plus ~30 ms for the jump-forward FSM), but grows fast with the DFA: bounded counters such as
  `[0-9]{0,17}` take 1-4 s, and any unconstrained value (`{}`, `json_object`: a ~13k-char regex)
  35-60 s. Compiles run off the scheduler thread (`GrammarCache`; the index build releases the GIL).
- outlines' `Guide` is not used: copying one clones the whole index (1-15 ms), and its rollback
  depth is fixed up front. A request's state is the index state plus a history list, and bitmask
  rows are cached per index state in the compiled grammar (~1 ms to build a row once).

Only json_schema, json_object (any JSON value, nesting-limited) and regex are supported.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import outlines_core
import torch
from outlines_core.json_schema import build_regex_from_schema

from radixgen.common.byte_vocab import gpt2_byte_decoder
from radixgen.grammar.base import (
    KIND_LABELS,
    CompiledGrammar,
    ConstraintSpec,
    Grammar,
    GrammarBackend,
    GrammarError,
    bitmask_width,
    set_token_bit,
)
from radixgen.grammar.jump_forward import CharState, RegexJumpForward

SENTINEL = "\U0010ffff"
FLEXIBLE_WHITESPACE = r"[ \t\n\r]*"




def token_bytes_table(hf_tokenizer: Any, vocab_size: int) -> list[bytes | None]:
    """The bytes each token id stands for; None for special tokens and ids without a token."""
    table: list[bytes | None] = [None] * vocab_size
    special = {i for i, t in getattr(hf_tokenizer, "added_tokens_decoder", {}).items() if t.special}
    decoder = gpt2_byte_decoder()
    byte_level = all(c in decoder for tok in list(hf_tokenizer.get_vocab())[:2000] for c in tok)
    for token, idx in hf_tokenizer.get_vocab().items():
        if idx >= vocab_size or idx in special:
            continue
        if byte_level and all(c in decoder for c in token):
            table[idx] = bytes(decoder[c] for c in token)
        else:  # added non-special tokens and non-byte-level vocabularies: the text itself
            table[idx] = hf_tokenizer.convert_tokens_to_string([token]).encode("utf-8")
    return table


@dataclass(frozen=True)
class OutlinesCompiled:
    """What one compile produces: the regex, its token index, the jump-forward FSM, and a lazily
    filled per-index-state cache of bitmask rows (EOS bits included), shared by all requests."""

    regex: str
    index: outlines_core.Index
    jump: RegexJumpForward | None
    masks: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)


class OutlinesBackend(GrammarBackend):
    """outlines-core backend: json_schema / json_object / regex."""

    name = "outlines"

    def __init__(self, tokenizer: Any, vocab_size: int | None = None) -> None:
        self.vocab_size = int(vocab_size or tokenizer.vocab_size)
        self.stop_token_ids = tuple(tokenizer.eos_token_ids)
        self.sentinel_id = self.vocab_size  # fake token id, never sampled
        self.token_bytes = token_bytes_table(tokenizer.hf, self.vocab_size)
        groups: dict[bytes, list[int]] = {}
        for idx, data in enumerate(self.token_bytes):
            if data and b"\xf4" not in data:
                groups.setdefault(data, []).append(idx)
        groups[SENTINEL.encode("utf-8")] = [self.sentinel_id]
        self.vocabulary = outlines_core.Vocabulary(self.stop_token_ids[0], groups)

    def to_regex(self, spec: ConstraintSpec) -> str:
        """The regex a spec stands for."""
        if spec.kind == "regex":
            return spec.spec
        if spec.kind in ("json_schema", "json_object"):
            schema = spec.spec if spec.kind == "json_schema" else "{}"
            ws = FLEXIBLE_WHITESPACE if spec.any_whitespace else ""
            try:
                return build_regex_from_schema(schema, whitespace_pattern=ws)
            except Exception as e:  # TypeError (bad JSON) / ValueError (unsupported structure)
                raise GrammarError(f"invalid JSON schema constraint: {_first_line(e)}") from None
        raise GrammarError(
            f"the outlines backend supports json_schema, json_object and regex, not {spec.kind}; "
            "use grammar_backend='xgrammar'"
        )

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        t0 = time.perf_counter()
        regex = self.to_regex(spec)
        try:
            index = outlines_core.Index(f"(?:{regex}){SENTINEL}", self.vocabulary)
        except Exception as e:
            raise GrammarError(f"invalid {KIND_LABELS[spec.kind]} constraint: {_first_line(e)}") from None
        handle = OutlinesCompiled(regex, index, RegexJumpForward.try_build(regex))
        return CompiledGrammar(spec, self.name, handle, time.perf_counter() - t0)

    def matcher(self, compiled: CompiledGrammar) -> OutlinesGrammar:
        return OutlinesGrammar(self, compiled.handle)

    def state_mask(self, compiled: OutlinesCompiled, state: int) -> torch.Tensor:
        """The bitmask row of one index state: its allowed real tokens, plus the stop tokens when
        the sentinel is allowed (the output may end here). ~1 ms; cached per state by the caller."""
        width = bitmask_width(self.vocab_size)
        ids = np.fromiter(compiled.index.get_allowed_tokens(state), dtype=np.int64)
        ids = ids[ids < self.vocab_size]
        bits = np.zeros(32 * width, dtype=np.uint8)
        bits[ids] = 1
        bits[list(self.stop_token_ids)] = int(compiled.index.get_next_state(state, self.sentinel_id) is not None)
        return torch.from_numpy(np.packbits(bits, bitorder="little").view("<i4").copy())


class OutlinesGrammar(Grammar):
    """Per-request state: the index state plus the character-FSM position for jump-forward.

    `_history` has one entry per accepted token: (index state, FSM position) after it; the stop
    token repeats the last entry.
    """

    def __init__(self, backend: OutlinesBackend, compiled: OutlinesCompiled) -> None:
        self._backend = backend
        self._compiled = compiled
        self.stop_token_ids = backend.stop_token_ids
        start = CharState(None) if compiled.jump is None else compiled.jump.initial
        self._state = compiled.index.get_initial_state()
        self._char = start
        self._history: list[tuple[int, CharState]] = []
        self._start = (self._state, start)
        self._terminated = False

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id in self.stop_token_ids:
            if not self.can_terminate():
                return False
            self._terminated = True
            self._history.append((self._state, self._char))
            return True
        data = self._backend.token_bytes[token_id] if 0 <= token_id < self._backend.vocab_size else None
        if data is None:
            return False
        nxt = self._compiled.index.get_next_state(self._state, token_id)
        if nxt is None:
            return False
        self._state = nxt
        if self._compiled.jump is not None:
            self._char = self._compiled.jump.advance(self._char, data)
        self._history.append((self._state, self._char))
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._terminated:  # nothing may follow; allow only the stop tokens so the row stays valid
            bitmask[row].zero_()
            for tid in self.stop_token_ids:
                set_token_bit(bitmask[row], tid, True)
            return
        mask = self._compiled.masks.get(self._state)
        if mask is None:
            mask = self._compiled.masks.setdefault(self._state, self._backend.state_mask(self._compiled,
                                                                                          self._state))
        bitmask[row].copy_(mask)

    def can_terminate(self) -> bool:
        if self._terminated:
            return False
        return self._compiled.index.get_next_state(self._state, self._backend.sentinel_id) is not None

    def is_terminated(self) -> bool:
        return self._terminated

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens; {len(self._history)} accepted")
        if num_tokens:
            del self._history[-num_tokens:]
            self._state, self._char = self._history[-1] if self._history else self._start
            self._terminated = False  # a stop token can only have been the last entry

    def jump_forward(self) -> str | None:
        if self._terminated or self._compiled.jump is None:
            return None
        return self._compiled.jump.forced_string(self._char) or None

    def copy(self) -> OutlinesGrammar:
        twin = OutlinesGrammar.__new__(OutlinesGrammar)
        twin.__dict__.update(self.__dict__)
        twin._history = list(self._history)
        return twin


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def schema_to_regex(schema: dict | str, any_whitespace: bool = False) -> str:
    """The outlines regex for a JSON schema (for inspection and tests)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return build_regex_from_schema(text, whitespace_pattern=FLEXIBLE_WHITESPACE if any_whitespace else "")
