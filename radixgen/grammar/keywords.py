"""Which JSON-schema keywords each grammar backend enforces, and which ones a schema uses.

A grammar "enforces" a keyword when every output it allows satisfies it (soundness: the outputs a
caller gets validate). Narrower than the schema is allowed (e.g. `pattern` matched against the
whole string where JSON Schema searches; a format regex rejecting exotic but valid forms); looser
is not. The router (`router.py`) sends a schema to the first backend in its order that enforces
every keyword the schema uses; with none, strict mode (OpenAI `"strict": true`) is an error naming
the keyword, and otherwise the schema compiles on the backend missing the fewest, with warnings.

The tables below are measurements (llguidance 1.9.1, XGrammar 0.2.9, outlines-core 0.2.14 on the
SmolLM2 vocabulary), checked by `tests/grammar/test_keyword_coverage.py` with probe schemas (each
claimed keyword must reject its invalid probes) and by the JSON-Schema-Test-Suite run in strict
mode (no invalid instance of a schema the router accepts may pass). Keywords a backend refuses to
compile (llguidance's `not`, outlines' `minimum` without a type, ...) are listed as not enforced
too: the router then never tries that backend for such a schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# Keywords whose value is one subschema / a list of subschemas / a name -> subschema map.
SUBSCHEMA = ("additionalProperties", "additionalItems", "not", "contains", "propertyNames", "if", "then",
             "else", "unevaluatedProperties", "unevaluatedItems", "items", "contentSchema")
SUBSCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
SUBSCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

# Keywords that never constrain an instance (annotations, identifiers, containers of subschemas
# whose use is judged where they are referenced). Keywords outside the JSON Schema vocabulary are
# ignored too, as JSON Schema itself says.
NEUTRAL = frozenset({
    "$schema", "$id", "$anchor", "$comment", "$vocabulary", "$defs", "definitions", "title", "description",
    "default", "examples", "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType",
    "contentSchema", "$dynamicAnchor",
})
VOCABULARY = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
    "maxProperties", "minProperties", "required", "dependentRequired", "format", "allOf", "anyOf", "oneOf",
    "not", "if", "then", "else", "dependentSchemas", "prefixItems", "items", "additionalItems", "contains",
    "properties", "patternProperties", "additionalProperties", "propertyNames", "unevaluatedItems",
    "unevaluatedProperties", "dependencies", "$ref", "$dynamicRef",
})
STRING_KEYWORDS = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
ARRAY_KEYWORDS = frozenset({"minItems", "maxItems", "uniqueItems", "contains", "minContains", "maxContains",
                            "prefixItems", "items"})
OBJECT_KEYWORDS = frozenset({"minProperties", "maxProperties", "properties", "required", "additionalProperties",
                             "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas"})


@dataclass(frozen=True)
class KeywordUse:
    """One keyword in one schema object: `keyword` with `value` at JSON pointer `path`."""

    keyword: str
    value: Any
    path: str  # of the schema object holding the keyword ("" = the root)
    holder: dict = field(repr=False, compare=False, hash=False, default_factory=dict)

    def describe(self) -> str:
        what = f"'format': {self.value!r}" if self.keyword == "format" else repr(self.keyword)
        return f"{what} at {self.path or '/'}"


def keyword_uses(schema: Any, path: str = "") -> Iterator[KeywordUse]:
    """Every vocabulary keyword of a (normalized) schema, depth first, subschemas included."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key in VOCABULARY:
            yield KeywordUse(key, value, path, schema)
        here = f"{path}/{key}"
        if key in SUBSCHEMA or key == "dependencies":
            if isinstance(value, list):  # draft-7 tuple items
                for i, sub in enumerate(value):
                    yield from keyword_uses(sub, f"{here}/{i}")
            elif key == "dependencies" and isinstance(value, dict):
                for name, sub in value.items():
                    yield from keyword_uses(sub, f"{here}/{name}")
            else:
                yield from keyword_uses(value, here)
        elif key in SUBSCHEMA_LIST and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from keyword_uses(sub, f"{here}/{i}")
        elif key in SUBSCHEMA_MAP and isinstance(value, dict):
            for name, sub in value.items():
                yield from keyword_uses(sub, f"{here}/{name}")


def _declares(holder: dict, keyword: str) -> bool:
    """Whether the schema object restricts `type` to the one the keyword applies to."""
    types = holder.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if keyword in STRING_KEYWORDS:
        return types == {"string"}
    if keyword in NUMBER_KEYWORDS:
        return bool(types) and types <= {"integer", "number"}
    if keyword in ARRAY_KEYWORDS:
        return types == {"array"}
    if keyword in OBJECT_KEYWORDS:
        return types == {"object"}
    return True


def _plain_names(names: Any) -> bool:
    """Property names without characters JSON must escape (XGrammar mishandles those)."""
    items = names if isinstance(names, list) else list(names) if isinstance(names, dict) else []
    return all(isinstance(n, str) and n.isprintable() and '"' not in n and "\\" not in n for n in items)


@dataclass(frozen=True)
class Coverage:
    """What one backend enforces.

    enforced: keywords enforced wherever they appear (subject to `only_if`).
    formats: `format` values enforced (a format not listed is not enforced).
    typed: keywords enforced only in a schema object that restricts `type` to their type.
    only_if: keyword -> predicate on the `KeywordUse`; False means not enforced there.
    """

    backend: str
    enforced: frozenset[str]
    formats: frozenset[str] = frozenset()
    typed: frozenset[str] = frozenset()
    only_if: dict[str, Callable[[KeywordUse], bool]] = field(default_factory=dict)

    def why_not(self, use: KeywordUse) -> str | None:
        """Why this backend would not enforce `use` (a phrase following "is"), else None."""
        kw = use.keyword
        if kw == "format":
            return None if use.value in self.formats else "not enforced"
        if kw not in self.enforced and kw not in self.typed:
            return "not enforced"
        if kw in self.typed and not _declares(use.holder, kw):
            return "enforced only where the same schema object declares the matching 'type'"
        check = self.only_if.get(kw)
        if check is not None and not check(use):
            return "not enforced in this form"
        return None

    def unenforced(self, schema: Any) -> list[tuple[KeywordUse, str]]:
        """The keyword uses of `schema` this backend would not enforce, with the reason."""
        out = []
        for use in keyword_uses(schema):
            reason = self.why_not(use)
            if reason:
                out.append((use, reason))
        return out


def _xgrammar_safe_pattern(use: KeywordUse) -> bool:
    """No optional group `(...)?` holding a `*` or `+`: XGrammar 0.2.9 compiles those wrong in
    JSON-schema patterns (`^(?:xy[0-9]+)?$` accepts "1")."""
    pattern, stack, i = use.value, [], 0
    if not isinstance(pattern, str):
        return False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # skip a character class (a `]` right after `[` or `[^` is literal)
            j = i + 1 + (pattern[i + 1 : i + 2] == "^")
            j += pattern[j : j + 1] == "]"
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            continue
        if c == "(":
            stack.append(False)
        elif c in "*+" and stack:
            stack[-1] = True
        elif c == ")" and stack:
            starred = stack.pop()
            if starred and pattern[i + 1 : i + 2] == "?":
                return False
            if stack:
                stack[-1] = stack[-1] or starred
        i += 1
    return True


_PUNCT_ESCAPES = frozenset("^$.|?*+()[]{}-/#&~!%,:;<=>@_'`")


def _json_safe_pattern(use: KeywordUse) -> bool:
    """A pattern that can only match characters JSON strings hold unescaped: outlines-core pastes
    the pattern between the quotes as is, so a `.`, a negated class or `\\s` could emit a raw `"`,
    backslash or control character (`"a"b"` for `^a.*$`). Allowed: literals other than `"` and
    backslash, positive classes, `\\d`, `\\w` and escaped punctuation."""
    pattern, in_class, i = use.value, False, 0
    if not isinstance(pattern, str):
        return False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            if not (nxt in ("d", "w") or nxt in _PUNCT_ESCAPES):
                return False
            i += 2
            continue
        if c == '"' or ord(c) < 0x20 or (c == "." and not in_class) or (c == "[" and pattern[i + 1 : i + 2] == "^"):
            return False
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        i += 1
    return True


def _required_listed(use: KeywordUse) -> bool:
    """XGrammar and outlines-core enforce `required` only for names `properties` lists (escape-free)."""
    props = use.holder.get("properties")
    return _plain_names(use.value) and isinstance(props, dict) and set(use.value) <= set(props)


def _plain_ref(use: KeywordUse) -> bool:
    """A `$ref` to a JSON pointer in this document with no constraining siblings."""
    siblings = [k for k in use.holder if k in VOCABULARY and k != "$ref"]
    return isinstance(use.value, str) and (use.value == "#" or use.value.startswith("#/")) and not siblings


_CORE = frozenset({"type", "enum", "const", "properties", "required", "items", "prefixItems", "anyOf", "$ref",
                   "additionalProperties"})
_LOWERED_FORMATS = frozenset({"date", "time", "date-time", "hostname", "ipv4", "ipv6", "email", "uuid", "uri"})

COVERAGE: dict[str, Coverage] = {
    "llguidance": Coverage(
        "llguidance",
        enforced=_CORE | {"allOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                          "minLength", "maxLength", "pattern", "minItems", "maxItems", "minProperties",
                          "maxProperties", "patternProperties"},
        formats=_LOWERED_FORMATS,
    ),
    # XGrammar's length-bounded strings (minLength / maxLength) let raw control characters through,
    # which JSON forbids (`"a\x05"`), and reject escapes: not claimed.
    "xgrammar": Coverage(
        "xgrammar",
        enforced=_CORE,
        typed=frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern", "format",
                         "minItems", "maxItems", "minProperties", "maxProperties"}),
        formats=_LOWERED_FORMATS,
        only_if={
            "properties": lambda u: _plain_names(u.value),
            "required": _required_listed,
            "pattern": _xgrammar_safe_pattern,
            "$ref": _plain_ref,
        },
    ),
    "outlines": Coverage(
        "outlines",
        enforced=_CORE,
        typed=frozenset({"minLength", "maxLength", "pattern", "format", "minItems", "maxItems"}),
        formats=_LOWERED_FORMATS,
        only_if={"$ref": _plain_ref, "required": _required_listed, "pattern": _json_safe_pattern},
    ),
}
