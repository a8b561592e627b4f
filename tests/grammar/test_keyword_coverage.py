"""The keyword coverage tables (`keywords.COVERAGE`) against probe schemas, the router's choices, and
our format regexes against python-jsonschema's format checker.

A probe is a small typed schema with valid and invalid instances (compact JSON). Wherever a backend's
table claims every keyword of a probe, that backend (as the engine configures it: objects closed)
must reject its invalid instances; valid ones it rejects are printed (narrower is allowed: a closed
object, a full-match pattern). Where the table makes no claim, the probe shows why (the backend accepts an invalid
instance or cannot compile the schema): a printed matrix, and a few pinned facts that fail when a
library starts enforcing the keyword, so that the table can be updated.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixgen.grammar import GrammarError, json_schema_spec, make_router, regex_spec
from radixgen.grammar.formats import FORMAT_REGEX
from radixgen.grammar.keywords import COVERAGE

INT = {"type": "integer"}
PROBES = [  # (schema, valid instances, invalid instances)
    ({"type": "integer", "minimum": 3}, ["3", "40"], ["2", "-5"]),
    ({"type": "number", "maximum": 2.5}, ["2.5", "-1"], ["2.6", "30"]),
    ({"type": "number", "exclusiveMinimum": 0}, ["0.5"], ["0", "-1"]),
    ({"type": "integer", "exclusiveMaximum": 10}, ["9"], ["10", "11"]),
    ({"type": "integer", "multipleOf": 3}, ["9", "0"], ["7", "10"]),
    ({"type": "string", "minLength": 2}, ['"ab"'], ['"a"', '""']),
    ({"type": "string", "maxLength": 2}, ['"ab"'], ['"abc"', '"\x05"']),  # a raw control character is not JSON
    ({"type": "string", "pattern": "^[a-c]+$"}, ['"abc"'], ['"abd"', '""']),
    ({"type": "string", "pattern": "^(?:xy[0-9]+)?$"}, ['"xy1"', '""'], ['"1"', '"y1"']),
    ({"type": "string", "pattern": "^a.*$"}, ['"ab"', '"a\\"b"'], ['"a"b"', '"a\x05"', '"b"']),  # not JSON
    ({"type": "string", "pattern": "^[^x]*$"}, ['"ab"'], ['"a"b"', '"x"']),
    ({"type": "array", "items": INT, "minItems": 2}, ["[1,2]"], ["[1]", "[]"]),
    ({"type": "array", "items": INT, "maxItems": 1}, ["[1]"], ["[1,2]"]),
    ({"type": "array", "items": INT, "uniqueItems": True}, ["[1,2]"], ["[1,1]"]),
    ({"type": "array", "prefixItems": [INT, {"type": "string"}], "items": False}, ['[1,"a"]'],
     ['["a",1]', '[1,"a",2]']),
    ({"type": "array", "contains": {"const": 5}, "items": INT}, ["[1,5]"], ["[1,2]"]),
    ({"type": "object", "properties": {"a": INT}, "required": ["a"]}, ['{"a":1}'], ["{}", '{"a":"x"}']),
    ({"type": "object", "required": ["a"]}, ['{"a":1}'], ["{}"]),
    ({"type": "object", "additionalProperties": INT}, ['{"k":1}'], ['{"k":"x"}']),
    ({"type": "object", "properties": {"a": INT}, "additionalProperties": False}, ['{"a":1}'], ['{"a":1,"b":2}']),
    ({"type": "object", "patternProperties": {"^x": INT}, "additionalProperties": False}, ['{"x1":1}'],
     ['{"x1":"s"}', '{"y":1}']),
    ({"type": "object", "minProperties": 1}, ['{"a":1}'], ["{}"]),
    ({"type": "object", "maxProperties": 1}, ['{"a":1}'], ['{"a":1,"b":2}']),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, ['{"a":1,"b":2}'], ['{"a":1}']),
    ({"type": "object", "propertyNames": {"maxLength": 2}}, ['{"ab":1}'], ['{"abc":1}']),
    ({"enum": ["a", 1, None]}, ['"a"', "1", "null"], ['"b"', "2"]),
    ({"const": {"k": [1]}}, ['{"k":[1]}'], ['{"k":[2]}']),
    ({"anyOf": [INT, {"type": "boolean"}]}, ["1", "true"], ['"x"']),
    ({"oneOf": [INT, {"type": "number", "minimum": 2}]}, ["1", "2.5"], ["3"]),
    ({"allOf": [{"type": "integer"}, {"type": "integer", "minimum": 2}]}, ["2"], ["1"]),
    ({"not": {"type": "integer"}}, ['"a"'], ["1"]),
    ({"if": INT, "then": {"minimum": 5}, "else": {"type": "string"}}, ["6", '"a"'], ["3", "true"]),
    ({"$defs": {"p": {"type": "integer", "maximum": 3}}, "$ref": "#/$defs/p"}, ["3"], ["4", '"x"']),
    ({"type": "string", "format": "date"}, ['"2020-02-29"'], ['"2021-02-29"', '"2020-04-31"']),
    ({"type": "string", "format": "time"}, ['"23:59:59Z"'], ['"23:59:60Z"', '"12:00:00"']),
    ({"type": "string", "format": "email"}, ['"a.b@example.com"'], ['"a..b@example.com"', '"@x.com"']),
    ({"type": "string", "format": "ipv4"}, ['"10.0.0.1"'], ['"10.0.0.01"', '"256.1.1.1"']),
    ({"type": "string", "format": "uri"}, ['"https://a.org/p?q#f"'], ['"http://a.com:abc/"', '"no scheme"']),
    ({"type": "string", "format": "duration"}, ['"P1D"'], ['"1D"']),
]


@pytest.fixture(scope="module")
def router(tok):
    return make_router("llguidance", tok)


def _walk(backend, compiled, tok, text: str) -> bool:
    g = backend.matcher(compiled)
    return g.accept_tokens(tok.encode(text, add_special_tokens=False)) and g.can_terminate()


@pytest.mark.parametrize("name", ["llguidance", "xgrammar", "outlines"])
def test_claimed_keywords_are_enforced(name, router, tok, capsys):
    backend = router.backend(name)
    rows = []
    for schema, valid, invalid in PROBES:
        spec = json_schema_spec(schema)
        claimed = not COVERAGE[name].unenforced(json.loads(spec.spec))
        try:
            if name == "outlines" and not claimed and len(backend.to_regex(spec)) > 3000:
                rows.append(f"not claimed: {json.dumps(schema)}: not run (an unconstrained object: a slow index)")
                continue
            compiled = backend.compile(spec)
        except GrammarError as e:
            rows.append(f"{'CLAIMED ' if claimed else ''}{json.dumps(schema)}: does not compile ({str(e)[:60]})")
            continue
        accepted_invalid = [t for t in invalid if _walk(backend, compiled, tok, t)]
        rejected_valid = [t for t in valid if not _walk(backend, compiled, tok, t)]
        rows.append(f"{'claimed' if claimed else 'not claimed'}: {json.dumps(schema)}: invalid accepted "
                    f"{accepted_invalid}, valid rejected {rejected_valid}")
        if claimed:
            assert not accepted_invalid, (name, schema, accepted_invalid)
    with capsys.disabled():
        print(f"\n== probes on {name}\n" + "\n".join(rows))


@pytest.mark.parametrize("name, schema, invalid", [
    ("outlines", {"type": "integer", "minimum": 3}, "2"),  # outlines-core ignores numeric bounds
    ("xgrammar", {"multipleOf": 3}, "7"),  # keywords of an untyped schema are ignored
    ("xgrammar", {"type": "string", "pattern": "^(?:xy[0-9]+)?$"}, '"1"'),  # optional group holding +
    ("xgrammar", {"type": "object", "required": ["a"]}, "{}"),  # required names missing from properties
    ("xgrammar", {"type": "array", "items": INT, "uniqueItems": True}, "[1,1]"),
    ("outlines", {"type": "string", "pattern": "^a.*$"}, '"a\x05"'),  # pasted between the quotes: raw control
    ("xgrammar", {"type": "string", "maxLength": 5}, '"a\x05"'),  # bounded strings take control characters
])
def test_unclaimed_keywords_are_really_not_enforced(name, schema, invalid, router, tok):
    """Pinned library gaps behind the tables; a failure here means the library got better."""
    backend = router.backend(name)
    assert COVERAGE[name].unenforced(json.loads(json_schema_spec(schema).spec))
    assert _walk(backend, backend.compile(json_schema_spec(schema)), tok, invalid)


def test_router_picks_an_enforcing_backend_or_warns(router):
    assert router.compile(json_schema_spec({"type": "integer", "minimum": 3})).backend == "llguidance"
    compiled = router.compile(json_schema_spec({"type": "array", "items": INT, "uniqueItems": True}))
    assert compiled.warnings and "'uniqueItems'" in compiled.warnings[0]  # no backend enforces it
    with pytest.raises(GrammarError, match="strict mode.*'uniqueItems' at /"):
        router.compile(json_schema_spec({"type": "array", "items": INT, "uniqueItems": False,
                                         "prefixItems": [{"uniqueItems": True, "type": "array"}]}, strict=True))
    g = router.matcher(compiled)
    assert g.meta() == {"grammar_backend": compiled.backend, "grammar_warnings": list(compiled.warnings)}


def test_router_falls_back_by_kind_and_by_keyword(tok):
    outlines_first = make_router("outlines", tok)
    assert outlines_first.compile(regex_spec("[a-z]{3}")).backend == "outlines"
    assert outlines_first.compile(json_schema_spec({"type": "string", "maxLength": 3})).backend == "outlines"
    # outlines has no EBNF, and does not enforce numeric bounds: the next backend in the order takes them
    from radixgen.grammar import ebnf_spec

    assert outlines_first.compile(ebnf_spec('root ::= "a"')).backend == "llguidance"
    assert outlines_first.compile(json_schema_spec({"type": "integer", "minimum": 3})).backend == "llguidance"
    xgrammar_first = make_router("xgrammar", tok)
    assert xgrammar_first.compile(json_schema_spec({"type": "integer", "multipleOf": 3})).backend == "llguidance"
    assert xgrammar_first.order == ("xgrammar", "llguidance", "outlines")


def test_router_loads_no_backend_past_the_one_that_compiles(tok, monkeypatch):
    """A spec the first backend enforces and compiles imports (and builds) no other backend."""
    import radixgen.grammar

    asked: list[str] = []
    real = radixgen.grammar.backend_class
    monkeypatch.setattr(radixgen.grammar, "backend_class", lambda name: asked.append(name) or real(name))
    router = make_router("llguidance", tok)
    assert router.compile(json_schema_spec({"type": "integer", "minimum": 3})).backend == "llguidance"
    assert router.compile(regex_spec("[a-z]{3}")).backend == "llguidance"
    assert set(asked) == {"llguidance"} and set(router._backends) == {"llguidance"}


def test_disjoint_one_of_is_enforced_overlapping_is_not():
    disjoint = json_schema_spec({"oneOf": [INT, {"type": "string"}]}, strict=True)
    assert '"anyOf"' in disjoint.spec and '"oneOf"' not in disjoint.spec
    tagged = {"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                        {"type": "object", "properties": {"k": {"const": "b"}, "v": INT}, "required": ["k"]}]}
    assert '"anyOf"' in json_schema_spec(tagged).spec
    with pytest.raises(GrammarError, match="'oneOf'"):
        json_schema_spec({"oneOf": [INT, {"minimum": 2}]}, strict=True)


@pytest.fixture(scope="module")
def format_samples():
    """Strings per format: the suite's optional/format instances plus a few of our own."""
    from jsonschema_suite import suite_dir

    samples: dict[str, set[str]] = {name: set() for name in FORMAT_REGEX}
    root = suite_dir()
    if root is not None:
        for name in FORMAT_REGEX:
            path = root / "draft2020-12" / "optional" / "format" / f"{name}.json"
            if path.exists():
                for case in json.loads(path.read_text()):
                    samples[name] |= {t["data"] for t in case["tests"] if isinstance(t["data"], str)}
    samples["date"] |= {"2024-02-29", "1900-02-29", "2000-02-29", "0000-01-01", "9999-12-31", "2021-13-01"}
    samples["time"] |= {"00:00:00Z", "12:30:15.123+05:30", "24:00:00Z", "12:00:00+24:00", "1:00:00Z"}
    samples["date-time"] |= {"2024-02-29T12:00:00Z", "2023-02-29T12:00:00Z", "2024-01-01t00:00:00z"}
    samples["hostname"] |= {"a-b.c", "-a.com", "a" * 64 + ".com", "localhost", "a_b.com", "xn--abc"}
    return samples


@pytest.mark.parametrize("name", sorted(FORMAT_REGEX))
def test_format_regexes_accept_only_valid_values(name, format_samples):
    """Soundness against the generation tests' oracle: every sample our regex accepts passes
    python-jsonschema's 2020-12 format check; and the regex accepts typical valid values."""
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    regex = re.compile(FORMAT_REGEX[name])
    accepted = [s for s in format_samples[name] if regex.fullmatch(s)]
    assert accepted, name
    wrong = [s for s in accepted if not checker.conforms(s, name)]
    assert not wrong, (name, wrong)
