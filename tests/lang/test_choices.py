"""The three select scoring methods on hand-made token logprobs."""

import math

import pytest

from radixgen.lang.choices import (
    decide,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)

CHOICES = ["no", "yes, definitely"]
# "no": one unlikely token. "yes, definitely": an even less likely first token, then near-certain ones.
# The plain sum (-3.3 vs -2.0) favours the short choice; the per-token mean (-0.825 vs -2.0) does not.
LONG = [[-2.0], [-3.0, -0.1, -0.1, -0.1]]


def test_token_length_normalized_has_no_short_choice_bias():
    d = token_length_normalized(choices=CHOICES, token_logprobs=LONG)
    assert sum(LONG[0]) > sum(LONG[1])  # what a sum-based score would pick: the short one
    assert d.decision == "yes, definitely"
    assert d.meta_info["scores"] == pytest.approx([-2.0, -0.825])


def test_greedy_token_selection_decides_on_first_differing_token():
    assert greedy_token_selection(choices=CHOICES, token_logprobs=LONG).decision == "no"
    # a tie on token 0 is broken at token 1, where the short choice is padded with its own mean
    d = greedy_token_selection(choices=["a", "ab", "ac"], token_logprobs=[[-1.0], [-1.0, -0.5], [-1.0, -2.0]])
    assert d.decision == "ab"
    d = greedy_token_selection(choices=["a", "ab"], token_logprobs=[[-0.2], [-0.2, -0.9]])
    assert d.decision == "a"  # padding -0.2 beats -0.9


def test_unconditional_likelihood_normalized_discounts_a_priori_likely_choices():
    cond = [[-1.0], [-1.5]]
    uncond = [[-0.5], [-4.0]]  # "the" is likely anywhere; "Paris" is not
    d = unconditional_likelihood_normalized(choices=["the", "Paris"], token_logprobs=cond,
                                            unconditional_token_logprobs=uncond)
    assert d.decision == "Paris"
    assert d.meta_info["scores"] == pytest.approx([-0.5, 2.5])
    assert token_length_normalized(choices=["the", "Paris"], token_logprobs=cond).decision == "the"
    with pytest.raises(ValueError, match="unconditional"):
        unconditional_likelihood_normalized(choices=["a"], token_logprobs=[[-1.0]])


def test_errors_and_sampling():
    with pytest.raises(ValueError, match="2 choices but 1"):
        token_length_normalized(choices=["a", "b"], token_logprobs=[[-1.0]])
    d = decide(token_length_normalized, ["a", "b"], [[-1.0], [-1.0 - math.log(1e6)]], temperature=1.0)
    assert d.decision == "a" and d.meta_info["temperature"] == 1.0
