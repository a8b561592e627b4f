"""Per-request sampling parameters (SGLang's field names) and their validation.

`SamplingParams` is plain data: the server / engine builds one per request (`from_dict` for JSON
input), calls `validate(vocab_size)` once at the boundary, and from then on the sampler trusts it.
Semantics follow SGLang / OpenAI: temperature 0 means greedy, `top_k=-1` means no top-k cut,
penalties act on the tokens generated so far, `logit_bias` maps token id -> additive bias.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

MAX_TOP_LOGPROBS = 20
CONSTRAINT_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")


@dataclass
class SamplingParams:
    """How to sample one sequence. Defaults reproduce plain multinomial sampling at temperature 1."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = field(default=None)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    speculative: bool = True  # False: this request never drafts (when the engine runs speculative decoding)
    # Constraints (at most one); compiled by the grammar backend.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    # How a constraint is applied (see radixgen/grammar): `strict_schema` rejects a JSON schema using a
    # keyword no grammar backend enforces (else it is accepted with a warning in meta_info);
    # `any_whitespace` lets JSON use any whitespace (pretty printing) instead of the compact form;
    # `budget_aware` steers a constrained output to close before max_new_tokens (finish_reason forced).
    strict_schema: bool = False
    any_whitespace: bool = False
    budget_aware: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        elif isinstance(self.stop, tuple):
            self.stop = list(self.stop)

    # ---- derived properties -------------------------------------------------------------------

    @property
    def is_greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature 0 or top_k 1)."""
        return self.temperature == 0 or self.top_k == 1

    @property
    def constraint(self) -> tuple[str, str] | None:
        """The (kind, spec) of the constraint set on this request, or None."""
        for name in CONSTRAINT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                return name, value
        return None

    @property
    def needs_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )

    # ---- construction and validation ------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Build from a JSON-style dict. Unknown keys raise ValueError naming the key; the result
        is validated for everything that does not need the vocabulary (see `validate`)."""
        d = dict(d or {})
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(k for k in d if k not in allowed)
        if unknown:
            raise ValueError(
                f"unknown sampling parameter {unknown[0]!r}; allowed keys: {', '.join(sorted(allowed))}"
            )
        bias = d.get("logit_bias")
        if isinstance(bias, dict):  # JSON object keys arrive as strings
            try:
                d["logit_bias"] = {int(k): v for k, v in bias.items()}
            except (TypeError, ValueError) as e:
                raise ValueError(f"logit_bias keys must be integer token ids, got {list(bias)[:5]}") from e
        params = cls(**d)
        params.validate()
        return params

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the offending field and its allowed range.
        With `vocab_size`, token ids (logit_bias keys, stop_token_ids) are checked against it."""
        _int("max_new_tokens", self.max_new_tokens, lo=0)
        _int("min_new_tokens", self.min_new_tokens, lo=0)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be <= max_new_tokens ({self.max_new_tokens}), got {self.min_new_tokens}"
            )
        _num("temperature", self.temperature, "[0, inf)", lambda v: v >= 0)
        _num("top_p", self.top_p, "(0, 1]", lambda v: 0 < v <= 1)
        _int("top_k", self.top_k)
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        _num("min_p", self.min_p, "[0, 1]", lambda v: 0 <= v <= 1)
        _num("repetition_penalty", self.repetition_penalty, "(0, inf)", lambda v: v > 0)
        _num("frequency_penalty", self.frequency_penalty, "[-2, 2]", lambda v: -2 <= v <= 2)
        _num("presence_penalty", self.presence_penalty, "[-2, 2]", lambda v: -2 <= v <= 2)
        _int("n", self.n, lo=1)
        if self.seed is not None:
            _int("seed", self.seed)
        _int("top_logprobs", self.top_logprobs, lo=0, hi=MAX_TOP_LOGPROBS)
        for name in ("ignore_eos", "skip_special_tokens", "logprobs", "strict_schema", "any_whitespace",
                     "budget_aware", "speculative"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a non-empty string or a list of non-empty strings, got {self.stop!r}")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list):
                raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
            for tok in self.stop_token_ids:
                _token_id("stop_token_ids", tok, vocab_size)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict token id -> bias, got {type(self.logit_bias)}")
            for tok, bias in self.logit_bias.items():
                _token_id("logit_bias", tok, vocab_size)
                _num(f"logit_bias[{tok}]", bias, "a finite number or -inf",
                     lambda v: not math.isnan(v) and v != math.inf)
        set_constraints = [name for name in CONSTRAINT_FIELDS if getattr(self, name) is not None]
        if len(set_constraints) > 1:
            raise ValueError(f"at most one of {', '.join(CONSTRAINT_FIELDS)} may be set, got {set_constraints}")
        for name in set_constraints:
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {type(getattr(self, name)).__name__}")


def _num(name: str, value: Any, allowed: str, ok: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number in {allowed}, got {value!r}")
    if math.isnan(value) or not ok(value):
        raise ValueError(f"{name} must be in {allowed}, got {value}")


def _int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ValueError(f"{name} must be in {rng}, got {value}")


def _token_id(name: str, tok: Any, vocab_size: int | None) -> None:
    if isinstance(tok, bool) or not isinstance(tok, int):
        raise ValueError(f"{name}: token ids must be integers, got {tok!r}")
    if tok < 0 or (vocab_size is not None and tok >= vocab_size):
        hi = f"{vocab_size - 1}" if vocab_size is not None else "inf"
        raise ValueError(f"{name}: token id {tok} is outside the vocabulary [0, {hi}]")
