"""A budget_aware request gets the same answer alone and among others (issue 40).

Object schemas (the generation schemas and the JSON-Schema-Test-Suite's object cases), greedy, with
`budget_aware`, on the shared SmolLM2 engine: sent by 16 threads at once with every compile racing
(each phase tags its schemas with a `title` of its own, so its specs are new to the grammar cache),
then one at a time, then by 16 threads again on the compiled grammars. Every answer must be the same
text with the same finish reason, each a valid instance. Before the fix some concurrent requests were
refused ("budget_aware: no completion was found") and others came out different: every matcher
searched its shortest completion in one bitmask row that the completer shared among all requests, so
a thread filling it for one request overwrote what another was reading.

A model-free twin (matchers built by 16 threads, plans compared) is in test_budget.py.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from jsonschema_suite import suite_dir
from schemas import GENERATION_SCHEMAS

from radixgen.grammar.router import unenforced_warnings

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 64  # small enough that many answers are closed by the budget (the search runs often)
THREADS = 16
SUITE_SCHEMAS = 12  # object cases of the test suite, after the generation schemas' objects


def object_schemas() -> list[dict]:
    """The generation schemas' objects, then the suite's object cases that a backend enforces in full
    (so every answer validates), deduplicated, without $ref."""
    out = [s for s in GENERATION_SCHEMAS if s.get("type") == "object"]
    root = suite_dir()
    if root is None:
        return out
    seen: set[str] = set()
    suite = []
    for path in sorted(root.glob("draft2020-12/*.json")):
        for case in json.loads(path.read_text()):
            schema = case["schema"]
            if not isinstance(schema, dict) or "properties" not in schema or "$ref" in json.dumps(schema):
                continue
            schema = {k: v for k, v in schema.items() if k != "$schema"}
            if all(unenforced_warnings(b, schema) for b in ("llguidance", "xgrammar")):
                continue
            key = json.dumps(schema, sort_keys=True)
            if key not in seen:
                seen.add(key)
                suite.append(schema)
    return out + suite[:SUITE_SCHEMAS]


def ask(engine, schema: dict, tag: str) -> tuple[str, object]:
    """(text, finish reason) of one greedy budget_aware request; ("refused", message) on an error."""
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Give an example JSON value for this schema: {json.dumps(schema)}"}])
    params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "budget_aware": True,
              "json_schema": json.dumps({**schema, "title": tag})}  # a spec of this phase's own
    try:
        out = engine.generate(prompt, params)
    except ValueError as e:  # GrammarError included
        return "refused", str(e)
    return out["text"], out["meta_info"]["finish_reason"]


def test_budget_aware_answers_alone_and_concurrent_are_the_same(engine):
    schemas = object_schemas()
    assert len(schemas) >= 36

    def concurrent(tag: str) -> list[tuple[str, object]]:
        with ThreadPoolExecutor(THREADS) as pool:
            return list(pool.map(lambda s: ask(engine, s, tag), schemas))

    racing = concurrent("racing compiles")
    alone = [ask(engine, s, "alone") for s in schemas]
    warm = concurrent("alone")  # the same specs as alone: compiled already
    refused = [(s, a[1]) for s, a in zip(schemas, alone, strict=True) if a[0] == "refused"]
    assert not refused, refused[0]
    for name, answers in (("compiles racing", racing), ("compiled", warm)):
        differ = [(s, a, b) for s, a, b in zip(schemas, alone, answers, strict=True) if a != b]
        assert not differ, f"{len(differ)} of {len(schemas)} answers differ alone and concurrent ({name}); " \
                           f"first: {differ[0]}"
    forced = 0
    for schema, (text, reason) in zip(schemas, alone, strict=True):
        jsonschema.validate(json.loads(text), schema)
        forced += bool(reason.get("forced"))
    print(f"\n{len(schemas)} schemas x 3 phases equal; {forced} answers closed by the budget")
