"""Schema rewrites that narrow a (normalized) JSON schema to what the engine generates.

Unlike `normalize.py`, these drop valid instances, never add any, so an output that satisfies the
rewritten schema satisfies the original (the grammar stays sound):
- `lower_formats`: `format`s the libraries get wrong become our own regexes (`formats.py`);
- `close_objects`: an object schema listing its `properties` allows no other keys unless it says
  so (`additionalProperties` / `patternProperties` / `unevaluatedProperties`). Generation then
  stays on-schema and jump-forward can force the closing brace; XGrammar's `strict_mode` and
  outlines-core behave this way already. Pass `extra_properties=True` to backends for JSON
  Schema's own semantics (the acceptance suite does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixgen.grammar.formats import LOWERED_FORMATS, format_pattern
from radixgen.grammar.keywords import SUBSCHEMA, SUBSCHEMA_LIST, SUBSCHEMA_MAP

_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "anyOf", "oneOf",
              "$ref", "if", "dependentSchemas", "dependencies")


def _rewrite(schema: Any, node: Callable[[dict, bool], dict], in_all_of: bool = False) -> Any:
    """Apply `node(schema_object, is_allof_branch)` bottom-up to every schema object."""
    if isinstance(schema, list):
        return [_rewrite(s, node, in_all_of) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in SUBSCHEMA or key in SUBSCHEMA_LIST:
            out[key] = _rewrite(value, node, key == "allOf")
        elif (key in SUBSCHEMA_MAP or key == "dependencies") and isinstance(value, dict):
            out[key] = {name: _rewrite(sub, node) for name, sub in value.items()}
        else:
            out[key] = value
    return node(out, in_all_of)


def _lower_format(obj: dict, _: bool) -> dict:
    fmt = obj.get("format")
    if fmt in LOWERED_FORMATS and "pattern" not in obj:  # two patterns cannot be combined: keep it
        obj = {k: v for k, v in obj.items() if k != "format"}
        obj["pattern"] = format_pattern(fmt)
    return obj


def _close_object(obj: dict, allof_branch: bool) -> dict:
    props = obj.get("properties")
    if (not isinstance(props, dict) or allof_branch or any(k in obj for k in _OPEN_KEYS)
            or not set(obj.get("required") or []) <= set(props)):
        return obj
    return {**obj, "additionalProperties": False}


def lower_formats(schema: Any) -> Any:
    """Each `format` of `formats.LOWERED_FORMATS` replaced by its anchored `pattern` (where the
    schema object has no `pattern` of its own; then the format stays, for the backend to check)."""
    return _rewrite(schema, _lower_format)


def close_objects(schema: Any) -> Any:
    """`additionalProperties: false` added to object schemas that list their `properties`, say
    nothing about other keys and are not combined with others (allOf branches, $ref siblings, ...)."""
    return _rewrite(schema, _close_object)


def narrow(schema: Any, extra_properties: bool = False) -> Any:
    """Both rewrites (formats always; objects closed unless `extra_properties`)."""
    schema = lower_formats(schema)
    return schema if extra_properties else close_objects(schema)
