"""User input -> `ConstraintSpec`: JSON schemas (dict, JSON text, pydantic model), regexes, EBNF,
Python dtypes, OpenAI `response_format` objects and SGLang-style sampling-param fields.

Everything is checked here, at the boundary, with messages that say what to fix; the backends then
trust the spec. JSON schemas get a canonical text (the cache key): object keys sorted, except the
members of `properties`, whose order is the order in which the engine emits the keys, and so part
of the meaning. Validation follows JSON Schema 2020-12 (draft-7 spellings accepted): a schema is an
object or a boolean, `type` names known JSON types, keyword values have the right JSON types,
`pattern`s are strings. `normalize_schema` rewrites meaning-preserving spellings the backends read
better (draft-7 tuples, boolean subschemas, integral floats, disjoint `oneOf` as `anyOf`).

In strict mode (OpenAI `"strict": true`) a schema using a keyword that no grammar backend enforces
(`keywords.COVERAGE`) is an error naming it; the router checks the backend it picks again at
compile time. Known semantic differences that are not errors: `pattern` may be matched against the
whole string (JSON Schema searches; narrower, so outputs still validate), untyped schemas with
object keywords are generated as objects, integral numbers are emitted without ".0".
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixgen.grammar.base import ConstraintSpec, GrammarError
from radixgen.grammar.keywords import COVERAGE, SUBSCHEMA, SUBSCHEMA_LIST, SUBSCHEMA_MAP
from radixgen.grammar.normalize import normalize_schema

JSON_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")

_NONNEG_INT = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
               "minContains", "maxContains")
_NUMBER = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def strict_violation(schema: Any, backends: tuple[str, ...] = tuple(COVERAGE)) -> str | None:
    """Strict mode: why no backend of `backends` would enforce all of `schema`, else None. Names
    the keyword(s) the closest backend misses."""
    best: list[str] | None = None
    for name in backends:
        missing = [f"{use.describe()} ({why} by {name})" for use, why in COVERAGE[name].unenforced(schema)]
        if not missing:
            return None
        if best is None or len(missing) < len(best):
            best = missing
    return ("strict mode: no grammar backend enforces every keyword of this JSON schema, so outputs could "
            f"violate it; not enforced: {'; '.join(best or [])}. Remove the keyword or send the request without "
            "strict (it is then accepted with a warning)")


# Python dtypes for `gen(dtype=...)`. bool is Python-flavoured `True|False` (the DSL hands the text to
# Python); int has no leading zeros and at most 18 digits (fits int64); str is a JSON string literal.
INT_REGEX = r"-?(0|[1-9][0-9]{0,17})"
FLOAT_REGEX = r"-?(0|[1-9][0-9]{0,17})(\.[0-9]{1,17})?([eE][-+]?[0-9]{1,3})?"
BOOL_REGEX = r"(True|False)"
STR_REGEX = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
DTYPE_REGEX = {int: INT_REGEX, float: FLOAT_REGEX, bool: BOOL_REGEX, str: STR_REGEX}


def _where(path: str) -> str:
    return f" at {path}" if path else ""


def validate_schema(schema: Any, path: str = "") -> None:
    """Raise GrammarError naming the first problem found in a JSON schema (recursively)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}{_where(path)}")
    for key, value in schema.items():
        here = f"{path}/{key}"
        if key == "type":
            types = value if isinstance(value, list) else [value]
            if not types or not all(isinstance(t, str) for t in types):
                raise GrammarError(f"'type' must be a type name or a list of them{_where(path)}")
            bad = [t for t in types if t not in JSON_TYPES]
            if bad:
                raise GrammarError(
                    f"unknown JSON type {bad[0]!r}{_where(path)}; expected one of {', '.join(JSON_TYPES)}"
                )
        elif key in SUBSCHEMA:
            if key == "items" and isinstance(value, list):  # draft-7 tuple form
                for i, sub in enumerate(value):
                    validate_schema(sub, f"{here}/{i}")
            else:
                validate_schema(value, here)
        elif key in SUBSCHEMA_LIST:
            if not isinstance(value, list) or (key != "prefixItems" and not value):
                raise GrammarError(f"'{key}' must be a non-empty list of schemas{_where(path)}")
            for i, sub in enumerate(value):
                validate_schema(sub, f"{here}/{i}")
        elif key in SUBSCHEMA_MAP:
            if not isinstance(value, dict):
                raise GrammarError(f"'{key}' must be an object mapping names to schemas{_where(path)}")
            for name, sub in value.items():
                if key == "patternProperties":
                    _check_pattern(name, f"{here}")
                validate_schema(sub, f"{here}/{name}")
        elif key == "required" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise GrammarError(f"'required' must be a list of property names{_where(path)}")
        elif key == "enum" and not isinstance(value, list):
            raise GrammarError(f"'enum' must be a list{_where(path)}")
        elif key in _NONNEG_INT and not (_is_int(value) and value >= 0):
            raise GrammarError(f"'{key}' must be a non-negative integer, got {value!r}{_where(path)}")
        elif key in _NUMBER and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            raise GrammarError(f"'{key}' must be a number, got {value!r}{_where(path)}")
        elif key == "multipleOf" and value <= 0:
            raise GrammarError(f"'multipleOf' must be > 0, got {value!r}{_where(path)}")
        elif key == "pattern":
            _check_pattern(value, path)
        elif key in ("$ref", "format") and not isinstance(value, str):
            raise GrammarError(f"'{key}' must be a string{_where(path)}")


def _is_int(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())


def _check_pattern(pattern: Any, path: str) -> None:
    # Only the type: pattern syntax (ECMA-262 here, Rust / XGrammar dialects in the backends) is
    # checked by the backend that compiles it, which names the error position.
    if not isinstance(pattern, str):
        raise GrammarError(f"'pattern' must be a string{_where(path)}")


def canonical_schema(schema: Any) -> Any:
    """A copy with object keys sorted, except `properties` members, which keep their order."""
    if isinstance(schema, list):
        return [canonical_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key in sorted(schema):
        value = schema[key]
        if key in SUBSCHEMA_MAP and isinstance(value, dict):
            names = value if key == "properties" else sorted(value)
            out[key] = {name: canonical_schema(value[name]) for name in names}
        elif key in SUBSCHEMA or key in SUBSCHEMA_LIST:
            out[key] = canonical_schema(value)
        else:  # data (const, enum, default, examples, required): kept as given
            out[key] = value
    return out


def canonical_schema_json(schema: Any) -> str:
    return json.dumps(canonical_schema(schema), separators=(",", ":"), ensure_ascii=False)


def _is_pydantic_model(obj: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return False
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def json_schema_spec(schema: Any, *, strict: bool = False, any_whitespace: bool = False) -> ConstraintSpec:
    """A JSON schema (dict / bool / JSON text / pydantic model class) -> json_schema spec."""
    if _is_pydantic_model(schema):
        schema = schema.model_json_schema()
    elif isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"JSON schema is not valid JSON: {e}") from None
    validate_schema(schema)
    schema = normalize_schema(schema)
    if schema is False:
        raise GrammarError("the JSON schema is `false` (or reduces to it): no value matches it")
    if strict:
        problem = strict_violation(schema)
        if problem:
            raise GrammarError(problem)
    return ConstraintSpec("json_schema", canonical_schema_json(schema), any_whitespace, strict)


def regex_spec(pattern: str) -> ConstraintSpec:
    """A regex the whole output must match (full match). Its syntax is checked when it is compiled
    (the backends' dialects differ from Python's `re`, e.g. `\\p{L}`), raising GrammarError there."""
    if not isinstance(pattern, str) or not pattern:
        raise GrammarError("regex must be a non-empty string")
    return ConstraintSpec("regex", pattern)


def ebnf_spec(grammar: str) -> ConstraintSpec:
    """GBNF-style EBNF text with a `root` rule (syntax errors surface when it is compiled)."""
    if not isinstance(grammar, str) or not grammar.strip():
        raise GrammarError("EBNF grammar must be a non-empty string")
    if not re.search(r"^\s*root\s*::=", grammar, re.MULTILINE):
        raise GrammarError("EBNF grammar has no 'root ::= ...' rule")
    return ConstraintSpec("ebnf", grammar)


def dtype_spec(dtype: type | str) -> ConstraintSpec:
    """int / float / bool / str (or their names) -> regex spec (see the *_REGEX constants)."""
    if isinstance(dtype, str):
        dtype = {"int": int, "float": float, "bool": bool, "str": str}.get(dtype, dtype)
    if dtype not in DTYPE_REGEX:
        raise GrammarError(f"unsupported dtype {dtype!r}; use int, float, bool or str")
    return ConstraintSpec("regex", DTYPE_REGEX[dtype])


def structural_tag_spec(tag: dict | str) -> ConstraintSpec:
    """`{"structures": [{"begin", "schema", "end"}], "triggers": [...]}` (or XGrammar's
    `{"type": "structural_tag", "format": {...}}`) -> structural_tag spec."""
    if isinstance(tag, str):
        try:
            tag = json.loads(tag)
        except json.JSONDecodeError as e:
            raise GrammarError(f"structural tag is not valid JSON: {e}") from None
    if not isinstance(tag, dict):
        raise GrammarError("structural tag must be a JSON object")
    if "format" not in tag:
        structures, triggers = tag.get("structures"), tag.get("triggers")
        if not isinstance(structures, list) or not structures:
            raise GrammarError("structural tag needs a non-empty 'structures' list")
        if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) for t in triggers):
            raise GrammarError("structural tag needs a non-empty 'triggers' list of strings")
        for i, s in enumerate(structures):
            if not isinstance(s, dict) or not {"begin", "schema", "end"} <= s.keys():
                raise GrammarError(f"structures[{i}] needs 'begin', 'schema' and 'end'")
            validate_schema(s["schema"], f"structures[{i}].schema")
        tag = {"structures": structures, "triggers": triggers}
    else:
        tag = {k: v for k, v in tag.items() if k in ("type", "format")}
    # keys keep their order: sorting them would reorder the `properties` of the JSON schemas inside,
    # and with them the order the engine emits the keys in
    return ConstraintSpec("structural_tag", json.dumps(tag, separators=(",", ":")))


def response_format_spec(response_format: Any, *, any_whitespace: bool = False) -> ConstraintSpec | None:
    """OpenAI `response_format` -> spec (None for plain text).

    {"type": "text"} -> None; {"type": "json_object"} -> json_object (any JSON value);
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} -> json_schema (strict: keywords
    no backend enforces are an error; a missing schema means any JSON); SGLang's
    {"type": "structural_tag", "structures", "triggers"} -> structural_tag.
    Pydantic objects from the server's protocol models are accepted via `model_dump()`.
    """
    if response_format is None:
        return None
    if hasattr(response_format, "model_dump"):
        response_format = response_format.model_dump(by_alias=True, exclude_none=True)
    if not isinstance(response_format, dict) or "type" not in response_format:
        raise GrammarError("response_format must be an object with a 'type'")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec("json_object", "", any_whitespace)
    if kind == "json_schema":
        body = response_format.get("json_schema")
        if not isinstance(body, dict):
            raise GrammarError("response_format json_schema needs a 'json_schema' object {name, schema, strict}")
        schema = body.get("schema", body.get("schema_"))
        if schema is None:
            return ConstraintSpec("json_object", "", any_whitespace)
        return json_schema_spec(schema, strict=bool(body.get("strict")), any_whitespace=any_whitespace)
    if kind == "structural_tag":
        return structural_tag_spec({k: v for k, v in response_format.items() if k != "type"}
                                   if "format" not in response_format else response_format)
    raise GrammarError(f"unknown response_format type {kind!r}; expected text, json_object, json_schema "
                       "or structural_tag")


def spec_from_params(
    json_schema: Any = None, regex: str | None = None, ebnf: str | None = None,
    structural_tag: Any = None, *, any_whitespace: bool = False, strict: bool = False,
) -> ConstraintSpec | None:
    """SGLang-style sampling params (`json_schema` / `regex` / `ebnf` / `structural_tag`) -> spec; at
    most one may be set. `any_whitespace` (flexible JSON whitespace) and `strict` (keywords no backend
    enforces are an error) apply to JSON schemas."""
    given = {k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("ebnf", ebnf),
                               ("structural_tag", structural_tag)) if v is not None}
    if len(given) > 1:
        raise GrammarError(f"only one constraint may be set, got {', '.join(given)}")
    if json_schema is not None:
        return json_schema_spec(json_schema, any_whitespace=any_whitespace, strict=strict)
    if regex is not None:
        return regex_spec(regex)
    if ebnf is not None:
        return ebnf_spec(ebnf)
    if structural_tag is not None:
        return structural_tag_spec(structural_tag)
    return None
