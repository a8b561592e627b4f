"""SamplingParams: defaults, from_dict, normalisation, and validation messages that name the field."""

from __future__ import annotations

import pytest

from radixgen.sampling import SamplingParams


def test_defaults_match_sglang():
    p = SamplingParams()
    assert (p.max_new_tokens, p.min_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (
        128, 0, 1.0, 1.0, -1, 0.0)
    assert (p.repetition_penalty, p.frequency_penalty, p.presence_penalty, p.n) == (1.0, 0.0, 0.0, 1)
    assert p.stop == [] and p.stop_token_ids is None and p.logit_bias is None and p.seed is None
    assert not p.ignore_eos and p.skip_special_tokens and not p.logprobs and p.top_logprobs == 0
    assert p.constraint is None and not p.is_greedy and not p.needs_penalties
    p.validate(vocab_size=10)


def test_is_greedy():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=0.7, top_k=1).is_greedy
    assert not SamplingParams(temperature=0.7, top_k=2).is_greedy


def test_from_dict_normalises_stop_and_bias_keys():
    p = SamplingParams.from_dict({"stop": "\n", "temperature": 0, "logit_bias": {"5": -1.5}, "seed": 3})
    assert p.stop == ["\n"] and p.is_greedy and p.logit_bias == {5: -1.5} and p.seed == 3
    assert SamplingParams.from_dict({"stop": ["a", "b"]}).stop == ["a", "b"]
    assert SamplingParams.from_dict({"stop": None}).stop == []
    assert SamplingParams.from_dict(None) == SamplingParams()


@pytest.mark.parametrize("key", ["max_tokens", "temprature", "response_format"])
def test_from_dict_rejects_unknown_keys(key):
    with pytest.raises(ValueError, match=repr(key)):
        SamplingParams.from_dict({key: 1})


def test_from_dict_validates():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams.from_dict({"top_p": 0})


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("temperature", -0.1, r"\[0, inf\)"),
        ("temperature", "hot", "number"),
        ("top_p", 0.0, r"\(0, 1\]"),
        ("top_p", 1.5, r"\(0, 1\]"),
        ("top_k", 0, "-1"),
        ("top_k", -2, "-1"),
        ("top_k", 2.5, "integer"),
        ("min_p", -0.1, r"\[0, 1\]"),
        ("min_p", 1.1, r"\[0, 1\]"),
        ("n", 0, r"\[1, inf\]"),
        ("max_new_tokens", -1, r"\[0, inf\]"),
        ("min_new_tokens", -1, r"\[0, inf\]"),
        ("repetition_penalty", 0.0, r"\(0, inf\)"),
        ("frequency_penalty", 2.5, r"\[-2, 2\]"),
        ("presence_penalty", -3.0, r"\[-2, 2\]"),
        ("top_logprobs", 21, r"\[0, 20\]"),
        ("top_logprobs", -1, r"\[0, 20\]"),
        ("seed", "abc", "integer"),
        ("logprobs", 1, "bool"),
        ("ignore_eos", "yes", "bool"),
        ("stop", [""], "non-empty"),
        ("stop", [1], "list of non-empty strings"),
        ("stop_token_ids", [-1], "outside the vocabulary"),
        ("logit_bias", {3: float("nan")}, "finite"),
        ("logit_bias", {3: float("inf")}, "finite"),
    ],
)
def test_validation_names_field_and_range(field, value, allowed):
    p = SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=field) as err:
        p.validate()
    assert err.match(allowed)


def test_min_new_tokens_above_max():
    with pytest.raises(ValueError, match="min_new_tokens must be <= max_new_tokens"):
        SamplingParams(min_new_tokens=10, max_new_tokens=5).validate()


def test_token_ids_checked_against_vocab():
    SamplingParams(logit_bias={9: 1.0}, stop_token_ids=[9]).validate(vocab_size=10)
    with pytest.raises(ValueError, match=r"logit_bias: token id 10 is outside the vocabulary \[0, 9\]"):
        SamplingParams(logit_bias={10: 1.0}).validate(vocab_size=10)
    with pytest.raises(ValueError, match="stop_token_ids: token id 12"):
        SamplingParams(stop_token_ids=[12]).validate(vocab_size=10)
    SamplingParams(logit_bias={3: float("-inf")}).validate(vocab_size=10)  # -inf bans a token


def test_at_most_one_constraint():
    p = SamplingParams(regex="a+")
    assert p.constraint == ("regex", "a+")
    p.validate()
    with pytest.raises(ValueError, match="at most one of json_schema, regex, ebnf, structural_tag"):
        SamplingParams(regex="a+", json_schema="{}").validate()
    with pytest.raises(ValueError, match="json_schema must be a string"):
        SamplingParams(json_schema={"type": "object"}).validate()
