"""User input -> `ConstraintSpec`: JSON schemas (dict, JSON text, pydantic model), regexes, EBNF,
Python dtypes, OpenAI `response_format` objects and SGLang-style sampling-param fields.

Everything is checked here, at the boundary, with messages that say what to fix; the backends then
trust the spec. JSON schemas get a canonical text (the cache key): object keys sorted, except the
members of `properties`, whose order is the order in which the engine emits the keys, and so part
of the meaning. Validation follows JSON Schema 2020-12 (draft-7 spellings accepted): a schema is an
object or a boolean, `type` names known JSON types, keyword values have the right JSON types,
`pattern`s are strings. In strict mode (OpenAI `"strict": true`) keywords the default backend does
not enforce (`unsupported_reason`: measured with XGrammar 0.2.9 on typed probe schemas and the
JSON-Schema-Test-Suite) are errors instead of being silently ignored. Known semantic differences
that are not errors: `pattern` is matched against the whole string (JSON Schema searches), untyped
schemas with object keywords are generated as objects, integral numbers are emitted without ".0".
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixgen.grammar.base import ConstraintSpec, GrammarError

JSON_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")

# Keywords whose value is one subschema / a list of subschemas / a name -> subschema map.
_SUBSCHEMA = ("additionalProperties", "additionalItems", "not", "contains", "propertyNames", "if", "then",
              "else", "unevaluatedProperties", "unevaluatedItems", "items")
_SUBSCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_NONNEG_INT = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
               "minContains", "maxContains")
_NUMBER = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")

# What XGrammar 0.2.9 does not enforce: it compiles schemas using these but accepts instances that
# violate them (measured with typed probe schemas and the JSON-Schema-Test-Suite). Strict mode rejects
# them; otherwise they are ignored, as the backend does.
UNSUPPORTED_KEYWORDS = frozenset(
    {"not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "contains",
     "minContains", "maxContains", "patternProperties"}
)
SUPPORTED_FORMATS = frozenset(
    {"email", "ipv4", "ipv6", "hostname", "date", "date-time", "time", "duration", "json-pointer",
     "relative-json-pointer", "uri", "uri-reference", "uri-template", "uuid"}
)


def unsupported_reason(key: str, value: Any) -> str | None:
    """Why a keyword would not be enforced (strict mode turns this into an error), else None."""
    if key in UNSUPPORTED_KEYWORDS:
        return "is not supported"
    if key in ("unevaluatedProperties", "unevaluatedItems") and value is not False:
        return "is only supported as false"
    if key == "uniqueItems" and value is True:
        return "is not supported (true)"
    if key == "allOf" and isinstance(value, list) and len(value) > 1:
        return "is only supported with a single subschema"
    if key == "format" and value not in SUPPORTED_FORMATS:
        return f"value {value!r} is not supported; supported: {', '.join(sorted(SUPPORTED_FORMATS))}"
    return None


# Python dtypes for `gen(dtype=...)`. bool is Python-flavoured `True|False` (the DSL hands the text to
# Python); int has no leading zeros and at most 18 digits (fits int64); str is a JSON string literal.
INT_REGEX = r"-?(0|[1-9][0-9]{0,17})"
FLOAT_REGEX = r"-?(0|[1-9][0-9]{0,17})(\.[0-9]{1,17})?([eE][-+]?[0-9]{1,3})?"
BOOL_REGEX = r"(True|False)"
STR_REGEX = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
DTYPE_REGEX = {int: INT_REGEX, float: FLOAT_REGEX, bool: BOOL_REGEX, str: STR_REGEX}


def _where(path: str) -> str:
    return f" at {path}" if path else ""


def validate_schema(schema: Any, path: str = "", strict: bool = False) -> None:
    """Raise GrammarError naming the first problem found in a JSON schema (recursively)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}{_where(path)}")
    for key, value in schema.items():
        here = f"{path}/{key}"
        reason = unsupported_reason(key, value) if strict else None
        if reason:
            raise GrammarError(f"strict mode: JSON schema keyword {key!r}{_where(path)} {reason} "
                               "by the grammar engine (it would not be enforced)")
        if key == "type":
            types = value if isinstance(value, list) else [value]
            if not types or not all(isinstance(t, str) for t in types):
                raise GrammarError(f"'type' must be a type name or a list of them{_where(path)}")
            bad = [t for t in types if t not in JSON_TYPES]
            if bad:
                raise GrammarError(
                    f"unknown JSON type {bad[0]!r}{_where(path)}; expected one of {', '.join(JSON_TYPES)}"
                )
        elif key in _SUBSCHEMA:
            if key == "items" and isinstance(value, list):  # draft-7 tuple form
                for i, sub in enumerate(value):
                    validate_schema(sub, f"{here}/{i}", strict)
            else:
                validate_schema(value, here, strict)
        elif key in _SUBSCHEMA_LIST:
            if not isinstance(value, list) or (key != "prefixItems" and not value):
                raise GrammarError(f"'{key}' must be a non-empty list of schemas{_where(path)}")
            for i, sub in enumerate(value):
                validate_schema(sub, f"{here}/{i}", strict)
        elif key in _SUBSCHEMA_MAP:
            if not isinstance(value, dict):
                raise GrammarError(f"'{key}' must be an object mapping names to schemas{_where(path)}")
            for name, sub in value.items():
                if key == "patternProperties":
                    _check_pattern(name, f"{here}")
                validate_schema(sub, f"{here}/{name}", strict)
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


def normalize_schema(schema: Any) -> Any:
    """Meaning-preserving rewrites into spellings the backends read (recursively):

    - draft-7 tuple `items: [...]` (+ `additionalItems`) -> `prefixItems` (+ `items`);
    - `false` branches of anyOf / oneOf and `true` branches of allOf are dropped (they never match /
      always match); an allOf with a `false` branch, or an anyOf / oneOf with only `false` ones, is
      `false`.
    """
    if isinstance(schema, list):
        return [normalize_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA or key in _SUBSCHEMA_LIST:
            out[key] = normalize_schema(value)
        elif key in _SUBSCHEMA_MAP and isinstance(value, dict):
            out[key] = {name: normalize_schema(sub) for name, sub in value.items()}
        else:
            out[key] = value
    if isinstance(out.get("items"), list):
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    for key in ("anyOf", "oneOf"):
        if isinstance(out.get(key), list) and any(b is False for b in out[key]):
            branches = [b for b in out[key] if b is not False]
            if not branches:
                return False
            out[key] = branches
    if isinstance(out.get("allOf"), list):
        if any(b is False for b in out["allOf"]):
            return False
        branches = [b for b in out["allOf"] if b is not True]
        if branches:
            out["allOf"] = branches
        else:
            del out["allOf"]
    return out


def canonical_schema(schema: Any) -> Any:
    """A copy with object keys sorted, except `properties` members, which keep their order."""
    if isinstance(schema, list):
        return [canonical_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key in sorted(schema):
        value = schema[key]
        if key in _SUBSCHEMA_MAP and isinstance(value, dict):
            names = value if key == "properties" else sorted(value)
            out[key] = {name: canonical_schema(value[name]) for name in names}
        elif key in _SUBSCHEMA or key in _SUBSCHEMA_LIST:
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
    validate_schema(schema, strict=strict)
    return ConstraintSpec("json_schema", canonical_schema_json(normalize_schema(schema)), any_whitespace)


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
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} -> json_schema (strict checks
    unsupported keywords; a missing schema means any JSON); SGLang's
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
    structural_tag: Any = None, *, any_whitespace: bool = False,
) -> ConstraintSpec | None:
    """SGLang-style sampling params (`json_schema` / `regex` / `ebnf`) -> spec; at most one may be set."""
    given = {k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("ebnf", ebnf),
                               ("structural_tag", structural_tag)) if v is not None}
    if len(given) > 1:
        raise GrammarError(f"only one constraint may be set, got {', '.join(given)}")
    if json_schema is not None:
        return json_schema_spec(json_schema, any_whitespace=any_whitespace)
    if regex is not None:
        return regex_spec(regex)
    if ebnf is not None:
        return ebnf_spec(ebnf)
    if structural_tag is not None:
        return structural_tag_spec(structural_tag)
    return None
