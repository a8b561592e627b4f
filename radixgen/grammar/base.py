"""Interfaces of the grammar engine: constraint specs, backends, per-request grammars, bitmasks.

A request's output constraint is a `ConstraintSpec` (kind + canonical text; it is the cache key).
A `GrammarBackend` compiles a spec once into a `CompiledGrammar`, shared by every request that uses
the same spec, and makes a fresh per-request `Grammar` (a matcher) from it. Per decode step the
engine accepts the sampled token into the grammar and asks it to fill one row of the batch's token
bitmask, which the sampler applies to the logits.

Bitmask layout (what the sampler consumes): int32 `[batch, ceil(V / 32)]`, contiguous on the CPU
(`allocate_bitmask`), bit `i` of word `j` set means token `32 * j + i` is allowed. Unconstrained
rows stay all ones (`-1`). Backends write rows in place through the tensor's data pointer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported lazily: `import radixgen.grammar` stays cheap
    import torch

KINDS = ("json_schema", "json_object", "regex", "ebnf", "structural_tag")
KIND_LABELS = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regex", "ebnf": "EBNF",
               "structural_tag": "structural tag"}


class GrammarError(ValueError):
    """A constraint that cannot be compiled: malformed schema, invalid regex, EBNF syntax error, ...

    The message names the problem; the engine reports it for the one request that sent it.
    """


@dataclass(frozen=True)
class ConstraintSpec:
    """What a request's output must match. Hashable: it is the compiled-grammar cache key.

    kind: one of `KINDS`.
    spec: canonical text: a JSON schema (JSON text, see `schema.canonical_schema_json`), a regex,
        EBNF text with a `root` rule, a structural-tag JSON object, or "" for json_object.
    any_whitespace: JSON kinds only: allow any whitespace between tokens (flexible mode) instead of
        the compact form `{"a":1,"b":[2,3]}` (the default, which needs the fewest tokens).
    strict: json_schema only (OpenAI `"strict": true`): a schema using a keyword that no backend
        enforces is an error naming it, instead of being accepted with a warning.
    """

    kind: str
    spec: str
    any_whitespace: bool = False
    strict: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown constraint kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        if not isinstance(self.spec, str):
            raise GrammarError(f"constraint spec must be a str, got {type(self.spec).__name__}")

    @property
    def key(self) -> tuple[str, str, bool, bool]:
        """The cache key: (kind, canonical spec, whitespace mode, strictness)."""
        return (self.kind, self.spec, self.any_whitespace, self.strict)

    def short(self, n: int = 60) -> str:
        """A one-line description for messages and logs."""
        text = self.spec if len(self.spec) <= n else self.spec[: n - 3] + "..."
        return f"{self.kind}:{text}"


@dataclass(frozen=True)
class CompiledGrammar:
    """A compiled constraint, shared (read-only) by all requests with the same spec."""

    spec: ConstraintSpec
    backend: str
    handle: Any = field(repr=False)  # the backend's own compiled object
    compile_seconds: float = 0.0
    warnings: tuple[str, ...] = ()  # non-strict mode: schema keywords this grammar does not enforce


class Grammar(ABC):
    """A per-request matcher: tracks how far the output has got through the grammar.

    Drive it once per decode step: `accept_token(sampled)`, stop if `is_terminated()`, optionally
    `jump_forward()`, then `fill_bitmask(mask, row)` for the next sample. Stop/EOS tokens are allowed
    by the bitmask exactly when `can_terminate()`; accepting one terminates the grammar (after that
    nothing is accepted, and `fill_bitmask` allows only the stop tokens).
    """

    stop_token_ids: tuple[int, ...] = ()
    backend_name: str = ""  # the backend that compiled this grammar (set by the router)
    warnings: tuple[str, ...] = ()  # schema keywords it does not enforce (non-strict mode)

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no state change) if the grammar does not allow it."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 CPU `[B, ceil(V/32)]`)."""

    @abstractmethod
    def can_terminate(self) -> bool:
        """Whether the output so far is complete, i.e. a stop/EOS token is allowed now."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether a stop token has been accepted; no further token is accepted after that."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (a stop token counts as one)."""

    @abstractmethod
    def jump_forward(self) -> str | None:
        """The continuation the grammar forces from here (e.g. `"name":"` after `{`), else None."""

    @abstractmethod
    def copy(self) -> Grammar:
        """An independent matcher at the same state (for n > 1 and fork)."""

    def set_budget(self, remaining: int) -> None:  # noqa: B027 - a hook plain matchers ignore
        """Told before a mask fill how many tokens the request may still emit. Plain matchers ignore
        it; `budget.BudgetAwareGrammar` closes the output in time."""

    def meta(self) -> dict[str, Any]:
        """What the response metadata reports about this constraint: the backend that compiled it and
        one warning per schema keyword it does not enforce."""
        m: dict[str, Any] = {"grammar_backend": self.backend_name}
        if self.warnings:
            m["grammar_warnings"] = list(self.warnings)
        return m

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Accept all of `token_ids` or none of them (rolls back on the first rejection)."""
        for i, tid in enumerate(token_ids):
            if not self.accept_token(int(tid)):
                if i:
                    self.rollback(i)
                return False
        return True

    def jump_and_retokenize(self, old_ids: Sequence[int], new_ids: Sequence[int]) -> bool:
        """After a jump-forward re-tokenized the output tail: replace `old_ids` by `new_ids`.

        `old_ids` are the last tokens this grammar accepted; `new_ids` the tokens of the same text
        plus the forced string. The common prefix is kept; the rest is rolled back and re-accepted.
        Returns False (state unchanged) if the grammar rejects the new tokens.
        """
        k = 0
        while k < min(len(old_ids), len(new_ids)) and old_ids[k] == new_ids[k]:
            k += 1
        if len(old_ids) > k:
            self.rollback(len(old_ids) - k)
        if self.accept_tokens(new_ids[k:]):
            return True
        self.accept_tokens(old_ids[k:])  # restore: these were accepted before
        return False


class GrammarBackend(ABC):
    """Compiles specs for one tokenizer/vocabulary and makes per-request matchers."""

    name: str = "base"
    kinds: frozenset[str] = frozenset(KINDS)  # the constraint kinds it compiles
    vocab_size: int  # logits width; bitmask rows have ceil(vocab_size / 32) words
    stop_token_ids: tuple[int, ...] = ()

    @classmethod
    def unsupported(cls, spec: ConstraintSpec) -> str | None:
        """Why this backend cannot take `spec` at all (a kind or form it lacks), else None."""
        if spec.kind not in cls.kinds:
            return f"{KIND_LABELS[spec.kind]} constraints"
        return None

    @abstractmethod
    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        """Compile `spec` (slow; run off the scheduler thread). Raises GrammarError on bad input."""

    @abstractmethod
    def matcher(self, compiled: CompiledGrammar) -> Grammar:
        """A fresh per-request grammar at the start state."""


def bitmask_width(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return (vocab_size + 31) // 32


def allocate_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """An all-ones (everything allowed) int32 bitmask `[batch, ceil(vocab_size / 32)]` on CPU."""
    import torch

    return torch.full((batch, bitmask_width(vocab_size)), -1, dtype=torch.int32)


def stop_only_row(bitmask: torch.Tensor, row: int, stop_token_ids: Sequence[int]) -> None:
    """Allow only the stop tokens in `bitmask[row]` (a terminated grammar's row: still samplable)."""
    bitmask[row].zero_()
    for tid in stop_token_ids:
        set_token_bit(bitmask[row], tid, True)


def set_token_bit(row: torch.Tensor, token_id: int, allowed: bool) -> None:
    """Set or clear one token's bit in a bitmask row (int32 `[W]`)."""
    word, bit = divmod(token_id, 32)
    value = int(row[word]) & 0xFFFFFFFF
    value = value | (1 << bit) if allowed else value & ~(1 << bit)
    row[word] = value - (1 << 32) if value >= 1 << 31 else value


def allowed_token_ids(row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The token ids whose bits are set in a bitmask row (int64 `[n]`, sorted)."""
    import numpy as np
    import torch

    bits = np.unpackbits(row.to(torch.int32).numpy().view(np.uint8), bitorder="little")[:vocab_size]  # [V]
    return torch.from_numpy(bits.nonzero()[0].astype(np.int64))
