"""32 JSON schemas for the generation tests: numeric bounds, formats, patterns, enums, nested arrays,
$ref/$defs, anyOf/oneOf, additionalProperties, allOf, recursion. Every keyword used is one the
grammar router enforces (so every finished output must validate)."""

from __future__ import annotations

FORMATS = ("date", "date-time", "time", "email", "ipv4", "uuid", "uri", "hostname")

GENERATION_SCHEMAS: list[dict] = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                               "minItems": 1, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}},
     "required": ["value"]},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                      "required": ["x", "y"]}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
     "required": ["a", "b"]},
    {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999}, "active": {"type": "boolean"}},
        "required": ["id", "active"]}}, "required": ["user"]},
    {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
     "required": ["p"]},
    {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5, "minimum": 10, "maximum": 100}},
     "required": ["n"]},
    {"type": "object", "properties": {"t": {"type": "number", "minimum": -10.5, "maximum": 10.5}}, "required": ["t"]},
    *({"type": "object", "properties": {"v": {"type": "string", "format": f}}, "required": ["v"]} for f in FORMATS),
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
     "required": ["code"]},
    {"type": "object", "properties": {"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}, "required": ["hex"]},
    {"type": "object", "properties": {"x": {"enum": [1, "two", None, True]}}, "required": ["x"]},
    {"type": "object", "properties": {"kind": {"const": "fixed"}, "n": {"type": "integer"}}, "required": ["kind", "n"]},
    {"type": "object", "properties": {"m": {"type": "array", "items": {"type": "array", "items": {"type": "integer"},
                                                                     "minItems": 1, "maxItems": 3},
                                            "minItems": 1, "maxItems": 3}}, "required": ["m"]},
    {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 10},
                                                                "qty": {"type": "integer", "minimum": 1}},
                                "required": ["sku", "qty"]}, "maxItems": 3},
    {"type": "object", "properties": {"id": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 12}]}},
     "required": ["id"]},
    {"type": "object", "properties": {"shape": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}},
         "required": ["kind", "r"]},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0}},
         "required": ["kind", "side"]}]}}, "required": ["shape"]},
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}, "maxProperties": 3},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 20}, "year": {"type": "integer"}},
     "required": ["title"], "additionalProperties": False},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
        "type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}},
     "$ref": "#/$defs/node"},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"type": "object", "properties": {"b": {"type": "string", "maxLength": 6}}, "required": ["b"]}]},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 10}}, "required": ["s"]},
    {"type": "object", "properties": {"note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]}},
     "required": ["note"]},
]
