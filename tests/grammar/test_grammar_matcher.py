"""Per-request Grammar behaviour shared by both backends: bitmask == accept_token, EOS exactly when
the grammar can end, copy independence, rollback, jump-forward, random token walks."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from radixgen.grammar import allocate_bitmask, allowed_token_ids, json_schema_spec, regex_spec

TOOL = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "arguments": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["location", "unit"],
        },
    },
    "required": ["name", "arguments"],
}
LONG_KEYS = {
    "type": "object",
    "properties": {"customer_identifier": {"type": "integer"}, "shipping_address_line": {"type": "string"}},
    "required": ["customer_identifier", "shipping_address_line"],
}
REGEXES = {
    "email": r"[a-z0-9._%+-]{1,20}@[a-z0-9-]{1,20}\.[a-z]{2,6}",
    "date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])",
    "hex_color": r"#[0-9a-fA-F]{6}",
}
SPECIAL_IDS = list(range(0, 2)) + list(range(3, 17))  # <|endoftext|>, <|im_start|>, <repo_name>, ...


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def allowed(g, vocab_size: int) -> set[int]:
    mask = allocate_bitmask(1, vocab_size)
    g.fill_bitmask(mask, 0)
    return set(allowed_token_ids(mask[0], vocab_size).tolist())


def grammar(backend, spec):
    return backend.matcher(backend.compile(spec))


def check_mask_matches_accept(g, backend, rng: random.Random, n_random: int = 1500, max_allowed: int = 2500):
    """Tokens allowed by the bitmask == tokens a copy accepts (random vocab subset + allowed ones)."""
    vocab = backend.vocab_size
    mask_ok = allowed(g, vocab)
    probe = set(rng.sample(range(vocab), n_random))
    probe |= set(rng.sample(sorted(mask_ok), min(len(mask_ok), max_allowed)))
    probe |= set(backend.stop_token_ids)
    for t in sorted(probe):
        assert g.copy().accept_token(t) == (t in mask_ok), (t, t in mask_ok)
    eos = backend.stop_token_ids[0]
    assert (eos in mask_ok) == g.can_terminate()
    return mask_ok


def test_bitmask_equals_accept(backend, tok):
    rng = random.Random(0)
    text = json.dumps({"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}},
                      separators=(",", ":"))
    ids = ids_of(tok, text)
    g = grammar(backend, json_schema_spec(TOOL))
    for i, t in enumerate(ids):
        if i in (0, 1, 4, len(ids) // 2, len(ids) - 2):
            mask_ok = check_mask_matches_accept(g, backend, rng)
            assert t in mask_ok
            assert not set(SPECIAL_IDS) & mask_ok
        assert g.accept_token(t)
    assert allowed(g, backend.vocab_size) == set(backend.stop_token_ids)
    g2 = grammar(backend, regex_spec(REGEXES["date"]))
    for t in ids_of(tok, "2024-0"):
        check_mask_matches_accept(g2, backend, rng)
        assert g2.accept_token(t)


def test_eos_only_when_grammar_can_end(backend, tok):
    g = grammar(backend, regex_spec(r"[0-9]{2,3}"))
    eos = backend.stop_token_ids[0]
    digit = {str(d): ids_of(tok, str(d))[0] for d in range(10)}
    assert not g.can_terminate() and eos not in allowed(g, backend.vocab_size)
    assert not g.accept_token(eos)
    assert g.accept_token(digit["1"]) and not g.can_terminate()
    assert eos not in allowed(g, backend.vocab_size)
    assert g.accept_token(digit["2"]) and g.can_terminate()
    ok = allowed(g, backend.vocab_size)
    assert eos in ok and digit["3"] in ok
    assert g.accept_token(digit["3"]) and g.can_terminate()
    assert allowed(g, backend.vocab_size) == set(backend.stop_token_ids)
    assert not g.is_terminated() and g.accept_token(eos) and g.is_terminated()
    assert not g.can_terminate() and not g.accept_token(digit["4"]) and not g.accept_token(eos)
    assert g.jump_forward() is None
    assert allowed(g, backend.vocab_size) == set(backend.stop_token_ids)  # a terminated row stays valid


def test_rejects_bad_tokens_without_state_change(backend, tok):
    g = grammar(backend, json_schema_spec(TOOL))
    before = allowed(g, backend.vocab_size)
    for t in ids_of(tok, "[") + [backend.vocab_size, backend.vocab_size + 5, -1] + SPECIAL_IDS:
        assert not g.accept_token(t)
    assert allowed(g, backend.vocab_size) == before


def test_copy_is_independent(backend, tok):
    g = grammar(backend, json_schema_spec(TOOL))
    assert g.accept_tokens(ids_of(tok, '{"name":"f'))
    state = allowed(g, backend.vocab_size)
    twin = g.copy()
    assert allowed(twin, backend.vocab_size) == state
    assert twin.accept_tokens(ids_of(tok, 'oo","arguments":{'))
    assert allowed(g, backend.vocab_size) == state  # the original did not move
    assert g.accept_tokens(ids_of(tok, 'un","arguments":{"location":"x","unit":"celsius"}}'))
    assert g.can_terminate() and not twin.can_terminate()
    assert twin.accept_tokens(ids_of(tok, '"location":"y","unit":"fahrenheit"}}')) and twin.can_terminate()
    twin2 = twin.copy()
    assert twin.accept_token(backend.stop_token_ids[0]) and not twin2.is_terminated()


def test_rollback(backend, tok):
    g = grammar(backend, json_schema_spec(TOOL))
    start = allowed(g, backend.vocab_size)
    ids = ids_of(tok, '{"name":"f","arguments":{"location":"x","unit":"celsius"}}')
    assert g.accept_tokens(ids[:5])
    mid = allowed(g, backend.vocab_size)
    assert g.accept_tokens(ids[5:]) and g.can_terminate()
    assert g.accept_token(backend.stop_token_ids[0]) and g.is_terminated()
    g.rollback(1)  # the stop token
    assert not g.is_terminated() and g.can_terminate()
    g.rollback(len(ids) - 5)
    assert allowed(g, backend.vocab_size) == mid and not g.can_terminate()
    g.rollback(5)
    assert allowed(g, backend.vocab_size) == start
    with pytest.raises(ValueError):
        g.rollback(1)
    assert g.accept_tokens(ids) and g.can_terminate()  # replays fine after rollback
    assert not g.accept_tokens(ids_of(tok, "}}"))  # all-or-nothing on rejection
    assert g.can_terminate()


def test_jump_forward_long_fixed_keys(backend, tok):
    g = grammar(backend, json_schema_spec(LONG_KEYS))
    assert g.jump_forward() == '{"customer_identifier":'
    assert g.accept_tokens(ids_of(tok, '{"customer_identifier":'))
    assert g.jump_forward() is None  # an integer: several continuations
    assert g.accept_tokens(ids_of(tok, "42"))
    assert g.jump_forward() is None  # more digits or ','
    assert g.accept_tokens(ids_of(tok, ","))
    assert g.jump_forward() == '"shipping_address_line":"'
    assert g.accept_tokens(ids_of(tok, '"shipping_address_line":"Main St'))
    assert g.jump_forward() is None  # inside a free string
    assert g.accept_tokens(ids_of(tok, '"'))
    assert g.jump_forward() == "}"
    assert g.accept_tokens(ids_of(tok, "}")) and g.can_terminate() and g.jump_forward() is None


def test_jump_and_retokenize(backend, tok):
    """The engine's jump-forward step: append the forced string, re-tokenize the tail, continue."""
    g = grammar(backend, json_schema_spec(LONG_KEYS))
    out = ids_of(tok, '{"customer_identifier":7,')
    assert g.accept_tokens(out)
    forced = g.jump_forward()
    tail = out[-2:]
    new_tail = ids_of(tok, tok.decode(tail) + forced)
    assert g.jump_and_retokenize(tail, new_tail)
    out = out[:-2] + new_tail
    assert tok.decode(out) == '{"customer_identifier":7,"shipping_address_line":"'
    assert g.accept_tokens(ids_of(tok, 'x"}')) and g.can_terminate()
    assert not g.copy().jump_and_retokenize([], ids_of(tok, "x"))  # rejected: state unchanged


def test_jump_forward_stops_at_utf8_boundaries(backend, tok):
    g = grammar(backend, regex_spec("(日本語|日本人)!"))
    assert g.jump_forward() == "日本"
    assert g.accept_tokens(ids_of(tok, "日本語"))
    assert g.jump_forward() == "!"


def random_walk(g, backend, rng: random.Random, max_steps: int = 64, p_stop: float = 0.3) -> list[int] | None:
    """Sample allowed tokens until a stop token is drawn; None if no stop within max_steps."""
    eos = set(backend.stop_token_ids)
    out: list[int] = []
    for _ in range(max_steps):
        ok = allowed(g, backend.vocab_size)
        assert ok, "dead end: no token allowed"
        body = sorted(ok - eos)
        t = rng.choice(sorted(ok & eos)) if (ok & eos and (not body or rng.random() < p_stop)) else rng.choice(body)
        assert g.accept_token(t)
        if t in eos:
            assert g.is_terminated()
            return out
        out.append(t)
    return None


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_random_walks_full_match(backend, tok, name):
    rng = random.Random(name)
    compiled = backend.compile(regex_spec(REGEXES[name]))
    finished = 0
    for _ in range(6):
        ids = random_walk(backend.matcher(compiled), backend, rng)
        if ids is None:
            continue
        finished += 1
        text = tok.decode(ids)
        assert re.fullmatch(REGEXES[name], text), (name, text)
    assert finished >= 4


def test_random_walks_json_validate(backend, tok):
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer"},
                       "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
        "required": ["color", "n", "ok"],
        "additionalProperties": False,
    }
    rng = random.Random(7)
    compiled = backend.compile(json_schema_spec(schema))
    finished = 0
    for _ in range(6):
        ids = random_walk(backend.matcher(compiled), backend, rng, max_steps=80, p_stop=0.6)
        if ids is None:
            continue
        finished += 1
        jsonschema.validate(json.loads(tok.decode(ids)), schema)
    assert finished >= 3


def test_unicode_strings(backend, tok):
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    g = grammar(backend, json_schema_spec(schema))
    text = json.dumps({"s": "héllo wörld 日本語 🙂"}, separators=(",", ":"), ensure_ascii=False)
    assert g.accept_tokens(ids_of(tok, text)) and g.can_terminate()
