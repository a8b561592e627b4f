"""The DSL constructors: argument checking and conversion (no model)."""

import json

import pytest
from pydantic import BaseModel

import radixgen as sgl
from radixgen.grammar.schema import DTYPE_REGEX
from radixgen.lang import ir
from radixgen.lang.api import dtype_regex


class Person(BaseModel):
    name: str
    age: int


def test_json_schema_accepts_str_dict_and_pydantic():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(sgl.gen("x", json_schema=schema).params.json_schema) == schema
    assert sgl.gen("x", json_schema=json.dumps(schema)).params.json_schema == json.dumps(schema)
    assert json.loads(sgl.gen("x", json_schema=Person).params.json_schema) == Person.model_json_schema()
    with pytest.raises(ValueError, match="not valid JSON"):
        sgl.gen("x", json_schema="{oops")


def test_dtype_and_regex_and_choices():
    assert sgl.gen_int("n").params.regex == dtype_regex(int)
    assert sgl.gen_string("s").params.regex == dtype_regex(str)
    assert sgl.gen("b", dtype=bool).params.regex == "(True|False)"
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)
    with pytest.raises(ValueError, match="invalid regex"):
        sgl.gen("x", regex="(")
    with pytest.raises(ValueError, match="at most one"):
        sgl.gen("x", regex="a", dtype=int)
    sel = sgl.gen("c", choices=["a", "b"])
    assert isinstance(sel, ir.Select) and sel.choices == ["a", "b"]
    with pytest.raises(ValueError):
        sgl.select("c", [])


def test_dtype_regexes_are_the_grammar_packages_and_sglangs_names():
    assert [dtype_regex(t) for t in (int, float, bool, str)] == [DTYPE_REGEX[t] for t in (int, float, bool, str)]
    assert (sgl.REGEX_INT, sgl.REGEX_FLOAT, sgl.REGEX_BOOL, sgl.REGEX_STR) == \
        (DTYPE_REGEX[int], DTYPE_REGEX[float], DTYPE_REGEX[bool], DTYPE_REGEX[str])


def test_sampling_params_layering():
    run_defaults = ir.SamplingParams.defaults().override(ir.SamplingParams.make(stop="\n", temperature=0.0))
    merged = run_defaults.override(sgl.gen("x", max_tokens=5, temperature=0.7).params)
    assert (merged.max_new_tokens, merged.temperature, merged.stop) == (5, 0.7, ("\n",))
    eng = merged.to_engine()
    assert eng["stop"] == ["\n"] and "regex" not in eng and eng["max_new_tokens"] == 5
    with pytest.raises(TypeError, match="unknown sampling"):
        ir.SamplingParams.make(bogus=1)


def test_expressions_concatenate():
    e = "Q: " + sgl.gen("a") + "\n" + sgl.select("b", ["x", "y"])
    assert [type(x).__name__ for x in ir.flatten(e)] == ["ConstantText", "Gen", "ConstantText", "Select"]
    assert [type(x).__name__ for x in ir.flatten(sgl.assistant(sgl.gen("a")))] == ["RoleBegin", "Gen", "RoleEnd"]
