"""Structured output over HTTP, against the real server: strict response_format that no grammar
backend can enforce is a 400 naming the keyword (official openai client); non-strict is accepted with
a warning in the native response metadata; budget_aware closes the JSON and says it was forced."""

from __future__ import annotations

import json

import pytest

UNIQUE = {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"},
                                                   "uniqueItems": True, "maxItems": 3}},
          "required": ["ids"], "additionalProperties": False}
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def test_strict_schema_with_an_unenforceable_keyword_is_a_400_naming_it(client, needs_constraints):
    openai = pytest.importorskip("openai")
    rf = {"type": "json_schema", "json_schema": {"name": "ids", "schema": UNIQUE, "strict": True}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "ids?"}],
                                       response_format=rf, max_tokens=20)
    body = err.value.body
    assert err.value.status_code == 400 and body["param"] == "response_format"
    assert "'uniqueItems'" in body["message"] and "strict" in body["message"]
    # the same schema without strict is served
    rf["json_schema"]["strict"] = False
    out = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "ids?"}],
                                         response_format=rf, max_tokens=30)
    assert out.choices[0].message.content.startswith('{"ids":[')


def test_non_strict_warning_and_budget_aware_in_native_metadata(server, needs_constraints):
    status, out = server.post("/generate", {"text": CHAT.format("Give three ids as JSON."), "sampling_params": {
        "json_schema": json.dumps(UNIQUE), "max_new_tokens": 30, "temperature": 0}})
    assert status == 200, out
    meta = out["meta_info"]
    assert meta["grammar_backend"] in ("llguidance", "xgrammar", "outlines")
    assert any("'uniqueItems'" in w and "not enforced" in w for w in meta["grammar_warnings"])
    person = {"type": "object", "properties": {"name": {"type": "string"}, "bio": {"type": "string"}},
              "required": ["name", "bio"], "additionalProperties": False}
    body = {"text": CHAT.format("Describe a famous scientist at length as JSON."),
            "sampling_params": {"json_schema": json.dumps(person), "max_new_tokens": 16, "temperature": 0}}
    status, cut = server.post("/generate", body)
    assert status == 200 and cut["meta_info"]["finish_reason"]["type"] == "length"
    body["sampling_params"]["budget_aware"] = True
    status, closed = server.post("/generate", body)
    assert status == 200, closed
    assert set(json.loads(closed["text"])) == {"name", "bio"}
    assert closed["meta_info"]["finish_reason"]["forced"] is True
    assert len(closed["output_ids"]) <= 16
    body["sampling_params"]["max_new_tokens"] = 4  # no valid output fits: refused, not cut
    status, err = server.post("/generate", body)
    assert status == 400 and "budget_aware" in err["error"]["message"]
