"""Meaning-preserving rewrites of a JSON schema into the spellings the grammar backends read.

Each rewrite leaves the set of valid instances unchanged (JSON Schema 2020-12):
- draft-7 tuple `items: [...]` (+ `additionalItems`) -> `prefixItems` (+ `items`);
- a `true` subschema -> `{}`; `false` branches of anyOf / oneOf and `{}` branches of allOf are
  dropped; an allOf with a `false` branch, or an anyOf / oneOf of only `false` ones, is `false`;
- integral floats of count keywords (`"maxLength": 2.0`) -> ints; `uniqueItems: false` dropped;
- a `oneOf` whose branches are pairwise disjoint (no instance matches two of them: different JSON
  types, disjoint `const` / `enum` values, or a required property with disjoint values, the usual
  discriminator) -> `anyOf`, which every backend enforces. Other `oneOf`s stay as they are: no
  backend enforces "exactly one", so the router treats them as not enforced.
"""

from __future__ import annotations

import json
from typing import Any

from radixgen.grammar.keywords import SUBSCHEMA, SUBSCHEMA_LIST, SUBSCHEMA_MAP

COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                  "minContains", "maxContains")
_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string"})


def normalize_schema(schema: Any) -> Any:
    """The schema rewritten as described in the module docstring (recursively; input unchanged)."""
    if schema is True:
        return {}
    if isinstance(schema, list):
        return [normalize_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in SUBSCHEMA or key in SUBSCHEMA_LIST:
            out[key] = normalize_schema(value)
        elif key in SUBSCHEMA_MAP and isinstance(value, dict):
            out[key] = {name: normalize_schema(sub) for name, sub in value.items()}
        elif key in COUNT_KEYWORDS and isinstance(value, float) and value.is_integer():
            out[key] = int(value)
        elif not (key == "uniqueItems" and value is False):
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
        branches = [b for b in out["allOf"] if b != {}]
        if branches:
            out["allOf"] = branches
        else:
            del out["allOf"]
    one_of = out.get("oneOf")
    if isinstance(one_of, list) and "anyOf" not in out and pairwise_disjoint(one_of):
        out["anyOf"] = out.pop("oneOf")
    return out


def pairwise_disjoint(branches: list[Any]) -> bool:
    """Whether no instance can match two of `branches` (a sufficient, conservative test)."""
    return all(disjoint(a, b) for i, a in enumerate(branches) for b in branches[i + 1:])


def disjoint(a: Any, b: Any) -> bool:
    """Whether schemas `a` and `b` (normalized) have no instance in common; False when unsure."""
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict) or "$ref" in a or "$ref" in b:
        return False
    common = _types(a) & _types(b)
    if not common:
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not va & vb:
        return True
    return common == {"object"} and _disjoint_property(a, b)


def _types(s: dict) -> frozenset[str]:
    """The JSON types an instance of `s` may have ("integer" counted as "number")."""
    t = s.get("type")
    if t is None:
        vals = s.get("enum", [s["const"]] if "const" in s else None)
        return frozenset(_type_of(v) for v in vals) if isinstance(vals, list) else _ALL_TYPES
    names = t if isinstance(t, list) else [t]
    return frozenset("number" if n == "integer" else n for n in names)


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _values(s: dict) -> frozenset[str] | None:
    """The allowed values (canonical JSON texts) when `s` has `const` / `enum`, else None."""
    vals = [s["const"]] if "const" in s else s.get("enum")
    if not isinstance(vals, list):
        return None
    return frozenset(json.dumps(v, sort_keys=True) for v in vals)


def _disjoint_property(a: dict, b: dict) -> bool:
    """Objects that both require a property whose values cannot agree (a discriminator)."""
    pa, pb = a.get("properties") or {}, b.get("properties") or {}
    both = set(a.get("required") or []) & set(b.get("required") or [])
    return any(name in pa and name in pb and disjoint(pa[name], pb[name]) for name in both)
