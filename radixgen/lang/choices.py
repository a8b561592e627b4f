"""Scoring methods for `select`: pure functions from per-choice token logprobs to a decision.

Each method is called as `method(choices=..., token_logprobs=..., unconditional_token_logprobs=...)`
where `token_logprobs[i]` are the logprobs of the tokens covering choice i, conditioned on the
program text (the backend tokenizes prompt + choice together, see backends/engine.py), and
`unconditional_token_logprobs[i]` (only for methods with `requires_unconditional = True`) the
logprobs of the same tokens after a neutral one-token context. They follow SGLang's
`sglang/lang/choices.py`:

- token_length_normalized: mean token logprob; unlike the plain sum it does not favour short choices.
- greedy_token_selection: compare token by token, keep the argmax set, stop when one is left;
  shorter choices are padded with their own mean logprob.
- unconditional_likelihood_normalized: mean of (conditional - unconditional) token logprobs, which
  discounts choices that are likely whatever the question ("surface form competition",
  Holtzman et al. 2021).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else -math.inf


def _check(choices: Sequence[str], token_logprobs: Sequence[Sequence[float]]) -> None:
    if not choices:
        raise ValueError("select needs at least one choice")
    if len(choices) != len(token_logprobs):
        raise ValueError(f"{len(choices)} choices but {len(token_logprobs)} logprob lists")


def _argmax(xs: Sequence[float]) -> int:
    return max(range(len(xs)), key=lambda i: xs[i])  # first index wins ties


def token_length_normalized(
    *, choices: Sequence[str], token_logprobs: Sequence[Sequence[float]],
    unconditional_token_logprobs: Sequence[Sequence[float]] | None = None,
) -> ChoicesDecision:
    """Pick the choice with the highest mean token logprob."""
    _check(choices, token_logprobs)
    scores = [_mean(lp) for lp in token_logprobs]
    return ChoicesDecision(choices[_argmax(scores)], {
        "method": "token_length_normalized", "scores": scores, "normalized_prompt_logprobs": scores,
        "token_logprobs": [list(lp) for lp in token_logprobs]})


def greedy_token_selection(
    *, choices: Sequence[str], token_logprobs: Sequence[Sequence[float]],
    unconditional_token_logprobs: Sequence[Sequence[float]] | None = None,
) -> ChoicesDecision:
    """Token-by-token argmax over the remaining choices; short choices padded with their mean."""
    _check(choices, token_logprobs)
    width = max(len(lp) for lp in token_logprobs)
    means = [_mean(lp) for lp in token_logprobs]
    rows = [list(lp) + [means[i]] * (width - len(lp)) for i, lp in enumerate(token_logprobs)]
    remaining = list(range(len(choices)))
    for j in range(width):
        best = max(rows[i][j] for i in remaining)
        remaining = [i for i in remaining if rows[i][j] == best]
        if len(remaining) == 1:
            break
    return ChoicesDecision(choices[remaining[0]], {
        "method": "greedy_token_selection", "scores": means, "normalized_prompt_logprobs": means,
        "token_logprobs": [list(lp) for lp in token_logprobs]})


def unconditional_likelihood_normalized(
    *, choices: Sequence[str], token_logprobs: Sequence[Sequence[float]],
    unconditional_token_logprobs: Sequence[Sequence[float]] | None = None,
) -> ChoicesDecision:
    """Pick the choice with the highest mean of conditional minus unconditional token logprob."""
    _check(choices, token_logprobs)
    if unconditional_token_logprobs is None:
        raise ValueError("unconditional_likelihood_normalized needs unconditional_token_logprobs")
    scores = []
    for cond, unc in zip(token_logprobs, unconditional_token_logprobs, strict=True):
        if len(cond) != len(unc):
            raise ValueError(f"conditional ({len(cond)}) and unconditional ({len(unc)}) token counts differ")
        scores.append(_mean([c - u for c, u in zip(cond, unc, strict=True)]))
    return ChoicesDecision(choices[_argmax(scores)], {
        "method": "unconditional_likelihood_normalized", "scores": scores,
        "normalized_prompt_logprobs": [_mean(lp) for lp in token_logprobs],
        "token_logprobs": [list(lp) for lp in token_logprobs],
        "unconditional_token_logprobs": [list(lp) for lp in unconditional_token_logprobs]})


unconditional_likelihood_normalized.requires_unconditional = True  # type: ignore[attr-defined]


def requires_unconditional(method: Any) -> bool:
    return bool(getattr(method, "requires_unconditional", False))


def decide(method: Any, choices: Sequence[str], token_logprobs: Sequence[Sequence[float]],
           unconditional_token_logprobs: Sequence[Sequence[float]] | None = None,
           temperature: float = 0.0, rng: Any = None) -> ChoicesDecision:
    """Run `method`; with temperature > 0, sample the decision from softmax(scores / temperature)."""
    d = method(choices=choices, token_logprobs=token_logprobs,
               unconditional_token_logprobs=unconditional_token_logprobs)
    scores = d.meta_info.get("scores")
    if temperature and temperature > 0 and scores:
        import random

        top = max(scores)
        weights = [math.exp((s - top) / temperature) if s > -math.inf else 0.0 for s in scores]
        d.decision = (rng or random).choices(list(choices), weights=weights)[0]
        d.meta_info["temperature"] = temperature
    return d
