"""Constrained generation on SmolLM2 (default backend): regexes full-match, EBNF, invalid constraints,
streaming, jump-forward. JSON-schema outputs per backend: test_structured_generation.py."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"

REGEXES = {
    "email": r"[a-z]{2,10}@[a-z]{2,10}\.(com|org|net)",
    "date": r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])",
    "phone": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    "hex_color": r"#[0-9a-fA-F]{6}",
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_outputs_full_match(engine, temperature):
    names = list(REGEXES)
    prompts = [CHAT.format(f"Write one {n.replace('_', ' ')}.") for n in names]
    params = [{"regex": REGEXES[n], "max_new_tokens": 40, "temperature": temperature, "seed": 3} for n in names]
    for n, out in zip(names, engine.generate(prompts, params), strict=True):
        assert re.fullmatch(REGEXES[n], out["text"]), (n, out["text"])


def test_ebnf_and_json_object(engine):
    ebnf = 'root ::= "yes" | "no" | "maybe"'
    out = engine.generate(CHAT.format("Is the sky blue?"), {"ebnf": ebnf, "max_new_tokens": 5, "temperature": 0})
    assert out["text"] in {"yes", "no", "maybe"}


@pytest.mark.parametrize(
    "params, needle",
    [
        ({"regex": "([a-z"}, "regex"),
        ({"json_schema": "{not json"}, "JSON"),
        ({"json_schema": json.dumps({"type": "strnig"})}, "strnig"),
        ({"ebnf": "root ::= ("}, "EBNF"),
    ],
)
def test_invalid_constraints_fail_that_request_only(engine, params, needle):
    with pytest.raises(ValueError, match=needle):
        engine.generate("hello", dict(params, max_new_tokens=4))
    ok = engine.generate("hello", {"regex": "[0-9]{3}", "max_new_tokens": 6, "temperature": 0})
    assert re.fullmatch("[0-9]{3}", ok["text"])


def test_streaming_constrained(engine):
    params = {"regex": REGEXES["date"], "max_new_tokens": 20, "temperature": 0}
    full = engine.generate(CHAT.format("A date?"), params)["text"]
    chunks = engine.generate(CHAT.format("A date?"), params, stream=True)
    assert "".join(c["text"] for c in chunks) == full


LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "maxLength": 20},
        "customer_account_identifier": {"type": "integer", "minimum": 0, "maximum": 99999},
        "customer_is_currently_active": {"type": "boolean"},
        "customer_preferred_contact_method": {"enum": ["email", "phone"]},
    },
    "required": ["customer_full_name", "customer_account_identifier", "customer_is_currently_active",
                 "customer_preferred_contact_method"],
}


@pytest.mark.parametrize("disable_overlap", [False, True])
def test_jump_forward_fewer_steps_and_valid(disable_overlap):
    from radixgen.runtime.engine import Engine

    prompt = CHAT.format("Make up a customer record as JSON.")
    params = [{"json_schema": json.dumps(LONG_KEYS), "max_new_tokens": 120, "temperature": 0.7, "seed": i}
              for i in range(4)]
    steps = {}
    for jump_off in (False, True):
        eng = Engine(disable_jump_forward=jump_off, disable_overlap=disable_overlap)
        try:
            before = eng.get_stats()["forward_steps"]
            outs = eng.generate([prompt] * 4, params)
            steps[jump_off] = eng.get_stats()["forward_steps"] - before
            for out in outs:
                jsonschema.validate(json.loads(out["text"]), LONG_KEYS)
                assert out["text"] == eng.tokenizer.decode(out["output_ids"])
            assert (eng.get_stats()["jump_forward_tokens"] > 0) == (not jump_off)
            assert eng.flush_cache() and eng.get_stats()["kv_used"] == 0
        finally:
            eng.shutdown()
    assert steps[False] * 1.3 <= steps[True]


@pytest.mark.parametrize("budget", [2, 3, 4, 5])
def test_jump_forward_reaching_max_new_tokens_finishes(engine, budget):
    # at budget 3 the forced " + " after "1" fills max_new_tokens exactly: the request must still end
    out = engine.generate(CHAT.format("Write a sum of three small numbers."),
                          {"regex": r"[1-9][0-9]?( \+ [1-9][0-9]?)*", "max_new_tokens": budget, "temperature": 0})
    assert out["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    assert len(out["output_ids"]) <= budget
