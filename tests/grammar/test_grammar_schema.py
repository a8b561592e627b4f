"""schema.py: user input -> ConstraintSpec (dtypes, pydantic, response_format, canonical keys) and
the errors bad constraints raise, from the boundary checks and from both backends' compilers."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import BaseModel

from radixgen.grammar import (
    ConstraintSpec,
    GrammarError,
    dtype_spec,
    ebnf_spec,
    json_schema_spec,
    regex_spec,
    response_format_spec,
    spec_from_params,
    structural_tag_spec,
)
from radixgen.grammar.schema import BOOL_REGEX, FLOAT_REGEX, INT_REGEX, STR_REGEX, normalize_schema


@pytest.mark.parametrize(
    "regex, good, bad",
    [
        (INT_REGEX, ["0", "7", "-12", "123456789012345678"], ["012", "-", "1.5", "+1", "-0x", "1234567890123456789"]),
        (FLOAT_REGEX, ["0", "0.5", "-1.25", "3e10", "-2.5E-3"], ["01.5", ".5", "1.", "1e", "--1"]),
        (BOOL_REGEX, ["True", "False"], ["true", "1", "Truee"]),
        (STR_REGEX, ['""', '"hi there"', r'"a \"q\" \\ \n \u00e9"', '"日本"'], ['"a', 'a"', '"\n"', r'"\x"']),
    ],
)
def test_dtype_regexes(regex, good, bad):
    for s in good:
        assert re.fullmatch(regex, s), s
    for s in bad:
        assert not re.fullmatch(regex, s), s


def test_dtype_specs_compile_and_constrain(backend, tok):
    for dtype, text, ok in [(int, "-42", True), (int, "042", False), ("float", "3.25", True), (bool, "True", True),
                            (bool, "true", False), (str, '"x y"', True)]:
        g = backend.matcher(backend.compile(dtype_spec(dtype)))
        assert (g.accept_tokens(tok.encode(text, add_special_tokens=False)) and g.can_terminate()) == ok, (dtype, text)
    with pytest.raises(GrammarError, match="dtype"):
        dtype_spec(list)


def test_pydantic_model_input(xgr_backend, tok):
    class Weather(BaseModel):
        city: str
        days: int
        metric: bool = True

    spec = json_schema_spec(Weather)
    assert spec.kind == "json_schema" and json.loads(spec.spec)["required"] == ["city", "days"]
    assert list(json.loads(spec.spec)["properties"]) == ["city", "days", "metric"]  # order kept
    g = xgr_backend.matcher(xgr_backend.compile(spec))
    text = Weather(city="Paris", days=3).model_dump_json()
    assert g.accept_tokens(tok.encode(text, add_special_tokens=False)) and g.can_terminate()


def test_canonical_key():
    a = json_schema_spec({"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}})
    b = json_schema_spec('{"properties": {"x": {"type": "integer"}}, "required": ["x"], "type": "object"}')
    assert a == b and hash(a) == hash(b)
    c = json_schema_spec({"type": "object", "properties": {"y": {}, "x": {}}})
    d = json_schema_spec({"type": "object", "properties": {"x": {}, "y": {}}})
    assert c != d  # property order is the emitted key order: part of the meaning
    assert json_schema_spec({"type": "string"}, any_whitespace=True) != json_schema_spec({"type": "string"})


def test_normalize_schema():
    assert normalize_schema({"items": [{"type": "integer"}], "additionalItems": False}) == {
        "prefixItems": [{"type": "integer"}], "items": False}
    assert normalize_schema({"anyOf": [False, {"type": "null"}]}) == {"anyOf": [{"type": "null"}]}
    assert normalize_schema({"oneOf": [False, False]}) is False
    assert normalize_schema({"allOf": [True, {"type": "null"}]}) == {"allOf": [{"type": "null"}]}
    assert normalize_schema({"properties": {"a": {"allOf": [{}, False]}}}) == {"properties": {"a": False}}


def test_response_format():
    assert response_format_spec({"type": "text"}) is None
    assert response_format_spec(None) is None
    assert response_format_spec({"type": "json_object"}) == ConstraintSpec("json_object", "")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = response_format_spec({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert spec == json_schema_spec(schema, strict=True) and spec.strict
    flexible = response_format_spec({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                                     any_whitespace=True)
    assert flexible.any_whitespace
    with pytest.raises(GrammarError, match="'not'"):
        response_format_spec({"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"not": {"type": "null"}}, "strict": True}})
    # not strict: accepted (the router compiles it with a warning saying 'not' is not enforced)
    response_format_spec({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "null"}}}})
    with pytest.raises(GrammarError, match="json_schema"):
        response_format_spec({"type": "json_schema"})
    with pytest.raises(GrammarError, match="yaml"):
        response_format_spec({"type": "yaml"})
    tag = response_format_spec({"type": "structural_tag", "structures": [
        {"begin": "<f>", "schema": schema, "end": "</f>"}], "triggers": ["<f"]})
    assert tag.kind == "structural_tag"


@pytest.mark.parametrize(
    "schema, needle",
    [
        ([1, 2], "object or a boolean"),
        (3, "object or a boolean"),
        ({"type": "strnig"}, "strnig"),
        ({"type": ["string", 5]}, "type"),
        ({"properties": {"a": {"type": "integr"}}}, "integr.*properties/a"),
        ({"properties": []}, "properties"),
        ({"required": "a"}, "required"),
        ({"minLength": -1}, "minLength"),
        ({"maximum": "10"}, "maximum"),
        ({"anyOf": []}, "anyOf"),
        ({"items": 5}, "items"),
        ("{not json", "not valid JSON"),
    ],
)
def test_malformed_schema_errors(schema, needle):
    with pytest.raises(GrammarError, match=needle):
        json_schema_spec(schema)


@pytest.mark.parametrize(
    "schema, keyword",
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"oneOf": [{"type": "integer"}, {"minimum": 1}]}, "oneOf"),  # overlapping branches: not anyOf
        ({"if": {"const": 1}, "then": {"const": 2}}, "if"),
        ({"type": "string", "format": "idn-email"}, "format"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    ],
)
def test_strict_mode_names_unsupported_keyword(schema, keyword):
    with pytest.raises(GrammarError, match=f"'{keyword}'"):
        json_schema_spec(schema, strict=True)
    json_schema_spec(schema)  # accepted (compiled with a warning) when not strict
    for enforced in ({"type": "array", "uniqueItems": False, "items": {"type": "string", "format": "email"}},
                     {"allOf": [{"type": "integer"}, {"minimum": 1}]},  # llguidance enforces these
                     {"oneOf": [{"type": "integer"}, {"type": "string"}]}):  # disjoint: anyOf
        assert json_schema_spec(enforced, strict=True).strict


def test_compile_errors_name_the_problem(backend):
    with pytest.raises(GrammarError, match="regex"):
        backend.compile(regex_spec("([a-z"))
    with pytest.raises(GrammarError, match="JSON schema"):
        backend.compile(ConstraintSpec("json_schema", '{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}'))


def test_ebnf_errors(xgr_backend, outlines_backend):
    with pytest.raises(GrammarError, match="EBNF.*line 1"):
        xgr_backend.compile(ebnf_spec("root ::= ("))
    with pytest.raises(GrammarError, match="root"):
        ebnf_spec('start ::= "a"')
    with pytest.raises(GrammarError, match="does not support EBNF"):
        outlines_backend.compile(ebnf_spec('root ::= "a"'))


def test_spec_from_params():
    assert spec_from_params() is None
    assert spec_from_params(regex="[0-9]+") == ConstraintSpec("regex", "[0-9]+")
    assert spec_from_params(ebnf='root ::= "a"').kind == "ebnf"
    assert spec_from_params(json_schema='{"type": "integer"}').spec == '{"type":"integer"}'
    with pytest.raises(GrammarError, match="only one"):
        spec_from_params(json_schema="{}", regex="a")
    with pytest.raises(GrammarError, match="kind"):
        ConstraintSpec("yaml", "")
    with pytest.raises(GrammarError, match="triggers"):
        structural_tag_spec({"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}]})
