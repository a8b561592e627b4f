"""Budget-aware matchers without a model: random token walks (a uniformly random allowed token each
step, the harshest sampler) under a budget, each backend first in the router. Every walk must end,
within its budget, in an output that parses and validates (python-jsonschema, format checker on)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from schemas import GENERATION_SCHEMAS

from radixgen.grammar import GrammarError, allocate_bitmask, allowed_token_ids, json_schema_spec, make_router

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def _walk(router, compiled, budget: int, rng: random.Random) -> tuple[list[int], object]:
    g = router.matcher(compiled, budget=budget)
    mask = allocate_bitmask(1, router.vocab_size)
    ids: list[int] = []
    while len(ids) < budget:
        g.set_budget(budget - len(ids))
        g.fill_bitmask(mask, 0)
        allowed = allowed_token_ids(mask[0], router.vocab_size).tolist()
        assert allowed, "empty mask"
        token = rng.choice(allowed)
        assert g.accept_token(token)
        if token in router.stop_token_ids:
            break
        ids.append(token)
    return ids, g


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar", "outlines"])
def test_random_walks_end_valid_within_budget(backend, tok):
    router = make_router(backend, tok)
    rng = random.Random(7)
    forced = walks = 0
    for schema in GENERATION_SCHEMAS:
        compiled = router.compile(json_schema_spec(schema))
        need = router.matcher(compiled, budget=10**6).needed()
        for budget in (need, need + 5, need + 30):
            ids, g = _walk(router, compiled, budget, rng)
            text = tok.decode(ids)
            jsonschema.Draft202012Validator(schema, format_checker=CHECKER).validate(json.loads(text))
            assert not g.overshoot, (schema, text)
            forced += g.forced
            walks += 1
    print(f"\n{backend} first: {walks} random walks valid, {forced} forced to close")
    assert forced >= walks // 3


def test_budget_below_the_shortest_output_is_refused(tok):
    router = make_router("llguidance", tok)
    compiled = router.compile(json_schema_spec({"type": "object", "properties": {"d": {"type": "string",
                                                                                       "format": "date"}},
                                                "required": ["d"]}))
    need = router.matcher(compiled, budget=10**6).needed()
    assert 10 < need < 20  # {"d":"0001-01-01"} + a stop token, digits one token each
    router.matcher(compiled, budget=need)
    with pytest.raises(GrammarError, match=f"takes {need} tokens.*max_new_tokens={need - 1}"):
        router.matcher(compiled, budget=need - 1)


def test_copy_and_rollback_keep_the_completion_consistent(tok):
    router = make_router("llguidance", tok)
    compiled = router.compile(json_schema_spec(GENERATION_SCHEMAS[0]))
    g = router.matcher(compiled, budget=40)
    ids = tok.encode('{"name":"Al', add_special_tokens=False)
    assert g.accept_tokens(ids)
    twin = g.copy()
    need = g.needed()  # ","age":0} and a stop token
    g.rollback(len(ids))
    assert g.needed() == router.matcher(compiled, budget=40).needed() != need  # back at the start
    assert twin.needed() == need  # the copy kept its own state
    assert twin.accept_tokens(tok.encode('","age":3}', add_special_tokens=False)) and twin.needed() == 1


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_matchers_built_by_many_threads_plan_as_alone(backend, tok):
    """One completer serves every request's matcher from many threads (issue 40: it searched in one
    shared bitmask row, so concurrent matchers got other plans or none, "no completion was found")."""
    from concurrent.futures import ThreadPoolExecutor

    router = make_router(backend, tok)
    compiled = [router.compile(json_schema_spec(s)) for s in GENERATION_SCHEMAS] * 4

    def plan(c) -> tuple[int | None, list[int] | None]:
        g = router.matcher(c, budget=10**6)
        return g.needed(), g._plan

    alone = [plan(c) for c in compiled]
    for _ in range(3):
        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(plan, compiled)) == alone


def test_a_long_shortest_output_that_fits_the_budget_is_found(tok):
    """The search goes as far as the budget allows (issue 40): 24 required string fields take ~700
    bytes, past the old fixed 512-byte limit, in ~230 tokens, within max_new_tokens=384."""
    router = make_router("llguidance", tok)
    props = {f"customer_field_number_{i}": {"type": "string"} for i in range(24)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    compiled = router.compile(json_schema_spec(schema))
    minimal = json.dumps(dict.fromkeys(props, ""), separators=(",", ":"))
    assert len(minimal) > 512
    need = router.matcher(compiled, budget=384).needed()
    assert 100 < need <= len(tok.encode(minimal, add_special_tokens=False)) + 1 <= 384
    with pytest.raises(GrammarError, match="takes .* tokens.*max_new_tokens=100"):  # found, and too long
        router.matcher(compiled, budget=100)
