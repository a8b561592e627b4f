"""Constrained generation on SmolLM2 with each grammar backend first in the router, on the 33 schemas
of `schemas.py` x (greedy, temperature 1.0), all requests of an engine in one batched `generate` call.

- Per backend, the schemas whose every keyword it enforces (all 33 for llguidance, 24 for XGrammar,
  24 for outlines): every finished output (finish_reason "stop") must validate with
  python-jsonschema, 2020-12 format checker on, and must come from that backend; outputs cut by
  max_new_tokens are counted and printed, not judged.
- Budget-aware mode on all 33 with a tight max_new_tokens (the shortest valid output + 6 tokens,
  per schema): every output parses and validates; the same run without the mode is the baseline.
Suite time: ~1.5-2 min on 2 idle cores (three engines; 48 new tokens at most)."""

from __future__ import annotations

import json
import time
from collections import Counter

import jsonschema
import pytest
from schemas import GENERATION_SCHEMAS

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
MAX_NEW_TOKENS = 48
SLACK = 6  # tight budget: the shortest valid output + this many tokens
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER  # the 2020-12 checkers ("time" is RFC 3339)


def _prompt(schema: dict) -> str:
    return CHAT.format(f"Give an example JSON value for this schema: {json.dumps(schema)}")


def _enforced_by(backend: str) -> list[dict]:
    """The schemas whose every keyword `backend` enforces (the others would be routed elsewhere)."""
    from radixgen.grammar import json_schema_spec
    from radixgen.grammar.keywords import COVERAGE

    return [s for s in GENERATION_SCHEMAS if not COVERAGE[backend].unenforced(json.loads(json_schema_spec(s).spec))]


def _validates(text: str, schema: dict) -> str | None:
    """None if `text` is JSON that validates against `schema` (formats checked), else why not."""
    try:
        jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER).validate(json.loads(text))
    except (json.JSONDecodeError, jsonschema.ValidationError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return None


@pytest.fixture(scope="module")
def engines(engine):
    """An engine per backend-first router: the session's default engine (llguidance first) and the
    others built on first use and shut down at the end of the module."""
    from radixgen.runtime.engine import Engine

    made: dict[str, Engine] = {}

    def get(backend: str) -> Engine:
        if backend == engine.config.grammar_backend:
            return engine
        if backend not in made:
            made[backend] = Engine(grammar_backend=backend)
        return made[backend]

    yield get
    for eng in made.values():
        eng.shutdown()


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar", "outlines"])
def test_finished_outputs_validate(engines, backend):
    eng = engines(backend)
    schemas = _enforced_by(backend)
    params = [{"json_schema": json.dumps(s), "max_new_tokens": MAX_NEW_TOKENS, "temperature": t, "seed": i}
              for t in (0.0, 1.0) for i, s in enumerate(schemas)]
    t0 = time.perf_counter()
    outs = eng.generate([_prompt(s) for s in schemas] * 2, params)
    seconds = time.perf_counter() - t0
    failures, finishes, served = [], Counter(), Counter()
    for i, out in enumerate(outs):
        meta, schema = out["meta_info"], schemas[i % len(schemas)]
        finishes[meta["finish_reason"]["type"]] += 1
        served[meta["grammar_backend"]] += 1
        assert not meta.get("grammar_warnings"), meta["grammar_warnings"]
        if meta["finish_reason"]["type"] == "stop":
            why = _validates(out["text"], schema)
            if why:
                failures.append(f"{json.dumps(schema)} ({'greedy' if i < len(schemas) else 't=1'}): "
                                f"{out['text']!r}: {why}")
    print(f"\n{backend}: {len(schemas)} schemas x 2 = {len(outs)} requests in {seconds:.1f} s; "
          f"finish {dict(finishes)}; compiled by {dict(served)}")
    assert not failures, "\n".join(failures)
    assert served == {backend: len(outs)}
    assert finishes["stop"] >= 0.75 * len(outs)  # most outputs finish within the budget


def test_budget_aware_outputs_always_parse(engines):
    from radixgen.grammar import json_schema_spec

    eng = engines("llguidance")
    router = eng.grammar_cache.backend
    budgets = [router.matcher(router.compile(json_schema_spec(s)), budget=10**6).needed() + SLACK
               for s in GENERATION_SCHEMAS]
    n = len(GENERATION_SCHEMAS)
    results = {}
    for mode in (True, False):
        params = [{"json_schema": json.dumps(s), "max_new_tokens": b, "temperature": t, "seed": i,
                   "budget_aware": mode}
                  for t in (0.0, 1.0) for i, (s, b) in enumerate(zip(GENERATION_SCHEMAS, budgets, strict=True))]
        outs = eng.generate([_prompt(s) for s in GENERATION_SCHEMAS] * 2, params)
        invalid = [(i, out["text"], _validates(out["text"], GENERATION_SCHEMAS[i % n])) for i, out in enumerate(outs)]
        invalid = [x for x in invalid if x[2]]
        forced = sum(bool(o["meta_info"]["finish_reason"].get("forced")) for o in outs)
        cut = sum(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs)
        results[mode] = (len(outs), forced, cut, invalid)
        assert all(len(o["output_ids"]) <= budgets[i % n] for i, o in enumerate(outs))
    total, forced, cut, invalid = results[True]
    base_total, _, base_cut, base_invalid = results[False]
    print(f"\nbudget-aware, max_new_tokens = shortest output + {SLACK} ({min(budgets)}-{max(budgets)} tokens): "
          f"{total - len(invalid)}/{total} parse and validate, {forced} forced to close, {cut} ended by length; "
          f"mode off: {base_total - len(base_invalid)}/{base_total} parse and validate, {base_cut} ended by length")
    assert not invalid, invalid[:5]
    assert forced > 0 and base_invalid  # the budget is tight enough to matter


def test_budget_aware_refuses_a_budget_no_output_fits(engines):
    eng = engines("llguidance")
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": "uuid"}}, "required": ["v"]}
    with pytest.raises(ValueError, match="budget_aware.*max_new_tokens=8"):
        eng.generate(_prompt(schema), {"json_schema": json.dumps(schema), "max_new_tokens": 8, "budget_aware": True})
    ok = eng.generate(_prompt(schema), {"json_schema": json.dumps(schema), "max_new_tokens": 8})  # mode off: cut
    assert ok["meta_info"]["finish_reason"]["type"] == "length"
