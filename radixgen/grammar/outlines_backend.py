"""The outlines-core grammar backend (Willard & Louf, "Efficient Guided Generation for Large Language
Models", 2023): a regex DFA lifted to tokens.

JSON schemas become regexes (`outlines_core.json_schema.build_regex_from_schema`, after `narrow.py`:
our own format regexes, objects closed); a regex becomes an `Index`: per DFA state, the allowed token ids and
their next states. Everything per token runs in outlines-core's Rust code:
- Masks: a per-request `Guide` writes the allowed tokens straight into the batch bitmask row
  (`Guide.write_mask_into`), as outlines' own torch kernel does.
- Termination: outlines-core 0.2.14 drops token transitions that leave an accepting DFA state for
  a non-accepting one (the bare regex `(0|[1-9][0-9]*)(\\.[0-9]+)?` rejects "10.5" after "10"). That
  only matters where a complete output can go on: a top-level number, a regex. Those (below
  `SENTINEL_MAX_CHARS`; see `needs_sentinel`) are indexed as
  `(?:regex)` followed by a sentinel character (NUL), and the sentinel is
  the text of the stop tokens: "the output may end here" is "a stop token leads to the final
  state", and the native mask carries the EOS bits. JSON cannot hold a raw NUL (strings exclude
  control characters), so for JSON the bits need no fix-up; a user regex whose `.` or negated class
  can read NUL as content gets its stop bits cleared in such states (`may_end`, cached per state).
  outlines' own EOS is a fake id past the logits; real tokens holding a NUL byte are left out.
  Other regexes are indexed as they are, with the real EOS (outlines allows it in final states).
- Jump-forward: the forced string of an index state is the longest common prefix of its allowed
  tokens' bytes, followed through the state reached by a token spelling exactly that prefix;
  computed on first visit of a state and cached in the compiled grammar (no character automaton is
  built at compile time, which took 3.7-34 s in pure Python on large schemas).

Compile cost is outlines-core's index build (Rust, GIL released): ~10-40 ms for a typical
tool-call schema with the 49k SmolLM2 vocabulary, but it grows with the DFA (bounded counters such
as `[0-9]{0,17}`, unconstrained sub-values: seconds); the compile deadline of the grammar cache
bounds it. Only json_schema, json_object (any JSON value, nesting-limited) and regex are supported.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import outlines_core
import torch
from outlines_core.json_schema import build_regex_from_schema

from radixgen.grammar.base import (
    KIND_LABELS,
    CompiledGrammar,
    ConstraintSpec,
    Grammar,
    GrammarBackend,
    GrammarError,
    bitmask_width,
    set_token_bit,
    stop_only_row,
)
from radixgen.grammar.narrow import narrow
from radixgen.grammar.vocab import cached_token_bytes, utf8_prefix

SENTINEL = "\x00"  # ends every indexed regex; JSON can hold no raw NUL, in strings or out
FLEXIBLE_WHITESPACE = r"[ \t\n\r]*"
MAX_JUMP_BYTES = 4096  # a forced run longer than this is cut (it is found again next step)
MAX_ROLLBACK = 64  # states a Guide keeps; deeper rollbacks replay the token history
SENTINEL_MAX_CHARS = 4000  # see OutlinesBackend.needs_sentinel


@dataclass(frozen=True)
class OutlinesCompiled:
    """One compile: the regex, its token index, and the per-state forced strings found so far
    (filled lazily, shared by all requests with this spec)."""

    regex: str
    index: outlines_core.Index
    sentinel: bool  # indexed as `(?:regex)` + SENTINEL (else plain, with the real EOS)
    jumps: dict[int, bytes] = field(default_factory=dict, repr=False)
    ends: dict[int, bool | None] = field(default_factory=dict, repr=False)  # state -> may the output end?


class OutlinesBackend(GrammarBackend):
    """outlines-core backend: json_schema / json_object / regex."""

    name = "outlines"
    kinds = frozenset({"json_schema", "json_object", "regex"})

    def __init__(self, tokenizer: Any, vocab_size: int | None = None, *, extra_properties: bool = False) -> None:
        self.vocab_size = int(vocab_size or tokenizer.vocab_size)
        self.extra_properties = extra_properties
        self.stop_token_ids = tuple(tokenizer.eos_token_ids)
        self.token_bytes = cached_token_bytes(tokenizer.hf, self.vocab_size)
        groups: dict[bytes, list[int]] = {}
        for idx, data in enumerate(self.token_bytes):
            if data and SENTINEL.encode() not in data:
                groups.setdefault(data, []).append(idx)
        self.plain_vocabulary = outlines_core.Vocabulary(self.stop_token_ids[0], groups)
        groups[SENTINEL.encode("utf-8")] = list(self.stop_token_ids)
        self.vocabulary = outlines_core.Vocabulary(self.vocab_size, groups)  # EOS: a fake id past the logits

    @staticmethod
    def needs_sentinel(spec: ConstraintSpec, regex: str) -> bool:
        """Whether an output of `spec` can be complete and still go on (a top-level number, a regex),
        which outlines-core's lost transitions would cut short, and the regex is small enough for the
        sentinel's cost: `(?:R)` + any suffix indexes ~20x slower than R alone on large regexes (any
        JSON value: 7 s -> 150 s here). Above `SENTINEL_MAX_CHARS`, such an output may stop at its first
        complete prefix (still valid)."""
        if len(regex) > SENTINEL_MAX_CHARS:
            return False
        return spec.kind != "json_schema" or top_level_may_be_number(json.loads(spec.spec))

    def to_regex(self, spec: ConstraintSpec) -> str:
        """The regex a spec stands for."""
        if spec.kind == "regex":
            return spec.spec
        if spec.kind in ("json_schema", "json_object"):
            schema = "{}"
            if spec.kind == "json_schema":
                schema = json.dumps(narrow(json.loads(spec.spec), self.extra_properties))
            ws = FLEXIBLE_WHITESPACE if spec.any_whitespace else ""
            try:
                return build_regex_from_schema(schema, whitespace_pattern=ws)
            except Exception as e:  # TypeError (bad JSON) / ValueError (unsupported structure)
                raise GrammarError(f"invalid JSON schema constraint: {_first_line(e)}") from None
        raise GrammarError(f"the outlines backend does not support {KIND_LABELS[spec.kind]} constraints")

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        t0 = time.perf_counter()
        regex = self.to_regex(spec)
        sentinel = self.needs_sentinel(spec, regex)
        try:
            index = (outlines_core.Index(f"(?:{regex}){SENTINEL}", self.vocabulary) if sentinel
                     else outlines_core.Index(regex, self.plain_vocabulary))
        except Exception as e:
            raise GrammarError(f"invalid {KIND_LABELS[spec.kind]} constraint: {_first_line(e)}") from None
        return CompiledGrammar(spec, self.name, OutlinesCompiled(regex, index, sentinel), time.perf_counter() - t0)

    def matcher(self, compiled: CompiledGrammar) -> OutlinesGrammar:
        return OutlinesGrammar(self, compiled.handle)

    def may_end(self, compiled: OutlinesCompiled, state: int) -> bool | None:
        """Whether the output may end at index `state`: True (the sentinel leads to the final state),
        False (the regex can read the sentinel character as content, e.g. `.*`, but not end here:
        the stop bits of the native mask must be cleared), None (the sentinel cannot follow). Without
        the sentinel: True in final states, else None. Cached."""
        if state not in compiled.ends:
            if not compiled.sentinel:
                compiled.ends[state] = True if compiled.index.is_final_state(state) else None
            else:
                nxt = compiled.index.get_next_state(state, self.stop_token_ids[0])
                compiled.ends[state] = None if nxt is None else compiled.index.is_final_state(nxt)
        return compiled.ends[state]

    def forced_bytes(self, compiled: OutlinesCompiled, state: int) -> bytes:
        """The bytes every continuation from index `state` starts with (b"" when the output may end
        there or two allowed tokens differ at once). Cached per state."""
        cached = compiled.jumps.get(state)
        if cached is not None:
            return cached
        start, out, seen = state, b"", set()
        index, stops = compiled.index, set(self.stop_token_ids)
        while state is not None and state not in seen and len(out) < MAX_JUMP_BYTES:
            seen.add(state)
            ids = index.get_allowed_tokens(state)
            if any(i in stops for i in ids):  # the output may end here (or stop bytes are content)
                break
            prefix = self._common_prefix(ids)
            if not prefix:
                break
            out += prefix
            exact = next((i for i in ids if self.token_bytes[i] == prefix), None)
            state = None if exact is None else index.get_next_state(state, exact)
        compiled.jumps[start] = out
        return out

    def _common_prefix(self, ids: list[int]) -> bytes:
        """Longest common prefix of the bytes of tokens `ids` (stops early once it is empty)."""
        table = self.token_bytes
        prefix: bytes | None = None
        for i in ids:
            data = table[i] if i < self.vocab_size else None
            if data is None:
                return b""
            if prefix is None:
                prefix = data
                continue
            n = 0
            while n < len(prefix) and n < len(data) and prefix[n] == data[n]:
                n += 1
            prefix = prefix[:n]
            if not prefix:
                return b""
        return prefix or b""


class OutlinesGrammar(Grammar):
    """Per-request state: an outlines `Guide` (state + recent history in Rust) and the token history
    (for rollbacks deeper than the Guide keeps)."""

    def __init__(self, backend: OutlinesBackend, compiled: OutlinesCompiled) -> None:
        self._backend = backend
        self._compiled = compiled
        self.stop_token_ids = backend.stop_token_ids
        self.vocab_size = backend.vocab_size
        self._row_words = bitmask_width(backend.vocab_size)
        self._guide = outlines_core.Guide(compiled.index, MAX_ROLLBACK)
        self._tokens: list[int] = []
        self._done = False
        self._extra_stops = () if compiled.sentinel else backend.stop_token_ids[1:]

    def accept_token(self, token_id: int) -> bool:
        if self._done or not 0 <= token_id < self.vocab_size:
            return False
        state = self._guide.get_state()
        if token_id in self.stop_token_ids:
            if not self._backend.may_end(self._compiled, state):
                return False
            self._done = True
            if not self._compiled.sentinel:  # outlines' own EOS leads nowhere: the Guide stays put
                self._tokens.append(token_id)
                return True
        elif self._compiled.index.get_next_state(state, token_id) is None:
            return False
        self._guide.advance(token_id, False)
        self._tokens.append(token_id)
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._done:
            stop_only_row(bitmask, row, self.stop_token_ids)
            return
        self._guide.write_mask_into(bitmask.data_ptr() + 4 * row * self._row_words, self._row_words, 4)
        ends = self._backend.may_end(self._compiled, self._guide.get_state())
        if ends is False or (ends and self._extra_stops):  # see `may_end`; plain: only the 1st stop is EOS
            for tid in self.stop_token_ids if ends is False else self._extra_stops:
                set_token_bit(bitmask[row], tid, bool(ends))

    def can_terminate(self) -> bool:
        return not self._done and bool(self._backend.may_end(self._compiled, self._guide.get_state()))

    def is_terminated(self) -> bool:
        return self._done

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= len(self._tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens; {len(self._tokens)} accepted")
        if not num_tokens:
            return
        del self._tokens[-num_tokens:]
        steps = num_tokens - (self._done and not self._compiled.sentinel)  # Guide moves it made
        self._done = False  # a stop token can only have been the last one
        if steps <= self._guide.get_allowed_rollback():
            self._guide.rollback_state(steps)
            return
        self._guide = outlines_core.Guide(self._compiled.index, MAX_ROLLBACK)
        for tid in self._tokens:
            self._guide.advance(tid, False)

    def jump_forward(self) -> str | None:
        if self._done:
            return None
        return utf8_prefix(self._backend.forced_bytes(self._compiled, self._guide.get_state())) or None

    def copy(self) -> OutlinesGrammar:
        twin = OutlinesGrammar(self._backend, self._compiled)
        twin._tokens = list(self._tokens)
        twin._done = self._done
        for tid in self._tokens[: len(self._tokens) - (self._done and not self._compiled.sentinel)]:
            twin._guide.advance(tid, False)
        twin.backend_name, twin.warnings = self.backend_name, self.warnings
        return twin


def top_level_may_be_number(schema: Any) -> bool:
    """Whether a (normalized) schema may allow a number as the whole output (conservative: True
    when unsure, e.g. through a $ref)."""
    if not isinstance(schema, dict):
        return schema is not False
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return bool({"number", "integer"} & set(types))
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list):
        return any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return any(top_level_may_be_number(b) for b in schema[key])
    return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
