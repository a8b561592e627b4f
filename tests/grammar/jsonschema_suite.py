"""Runs the JSON-Schema-Test-Suite (keyword subset in shared/data) through a grammar backend.

Every test instance is serialized the way the engine emits JSON (compact separators, object keys in
the schema's `properties` order), tokenized with the model tokenizer and fed token by token; before
each token the bitmask is checked to allow it. A valid instance must be accepted to the end and then
allow termination; an invalid one must be rejected somewhere (or not allow termination).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixgen.grammar import ConstraintSpec, GrammarBackend, GrammarError, allocate_bitmask, json_schema_spec
from radixgen.grammar.keywords import Coverage


def suite_dir() -> Path | None:
    """shared/data/json-schema-test-suite beside the repo (or inside it, or $RADIXGEN_SHARED)."""
    here = Path(__file__).resolve()
    candidates = [Path(os.environ["RADIXGEN_SHARED"])] if os.environ.get("RADIXGEN_SHARED") else []
    candidates += [here.parents[3] / "shared", here.parents[2] / "shared"]
    for c in candidates:
        d = c / "data" / "json-schema-test-suite"
        if d.is_dir():
            return d
    return None


@dataclass(frozen=True)
class Instance:
    file: str  # e.g. draft7/enum.json
    case: str
    test: str
    schema: Any
    data: Any
    valid: bool

    @property
    def keyword(self) -> str:
        return self.file.split("/", 1)[1].removesuffix(".json")


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        return [v for k, v in schema.items() if k == "$ref" and isinstance(v, str)] + [
            r for v in schema.values() for r in _refs(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in _refs(v)]
    return []


def load_instances(root: Path) -> tuple[list[Instance], int]:
    """All instances, de-duplicated across drafts on (schema, data, valid), and the number of cases
    left out because they `$ref` remote documents (not resolvable offline).

    The engine asserts `format`s (the generation tests check them with python-jsonschema's format
    checker), so the core `format.json` files, which test formats as annotations only ("an invalid
    date is valid"), are left out; `optional/format` files assert them. Their schemas are untyped
    (`{"format": "date"}`, which any non-string satisfies); there they are typed as strings
    (`{"type": "string", ...}`) and only string instances kept, so that the format itself is tested.
    """
    out, seen, remote = [], set(), 0
    for path in sorted(root.glob("draft*/**/*.json")):
        rel = path.relative_to(root).as_posix()
        if path.name == "format.json":
            continue
        assert_format = "/optional/format/" in rel
        for case in json.loads(path.read_text()):
            schema = case["schema"]
            if isinstance(schema, dict):
                schema = {k: v for k, v in schema.items() if k != "$schema"}
                if assert_format:
                    schema = {"type": "string", **schema}
            if any(not r.startswith("#") for r in _refs(schema)):
                remote += 1
                continue
            text = json.dumps(schema, sort_keys=True)
            for t in case["tests"]:
                if assert_format and not isinstance(t["data"], str):
                    continue
                key = (text, json.dumps(t["data"], sort_keys=True), t["valid"])
                if key in seen:
                    continue
                seen.add(key)
                out.append(Instance(rel, case["description"], t["description"], schema, t["data"], t["valid"]))
    return out, remote


def _merged_properties(schema: Any) -> dict:
    """The properties an object schema lists, in emission order: those of its `allOf` branches
    first (the canonical spec sorts `allOf` before `properties`), then its own."""
    if not isinstance(schema, dict):
        return {}
    props: dict = {}
    for branch in schema.get("allOf") or []:
        props.update({k: v for k, v in _merged_properties(branch).items() if k not in props})
    props.update({k: v for k, v in (schema.get("properties") or {}).items() if k not in props})
    return props


def emit_order(data: Any, schema: Any) -> Any:
    """`data` with object keys in the order the engine emits them (the schema's `properties` order)."""
    if not isinstance(schema, dict):
        return data
    if isinstance(data, dict):
        props = _merged_properties(schema)
        order = [k for k in props if k in data] + [k for k in data if k not in props]
        return {k: emit_order(data[k], props.get(k, schema.get("additionalProperties"))) for k in order}
    if isinstance(data, list):
        prefix = schema.get("prefixItems") or (schema["items"] if isinstance(schema.get("items"), list) else [])
        rest = schema.get("items") if isinstance(schema.get("items"), dict) else None
        return [emit_order(x, prefix[i] if i < len(prefix) else rest) for i, x in enumerate(data)]
    return data


def _integral_floats_as_ints(data: Any) -> Any:
    """1.0 -> 1: the engine emits a number's shortest form (an `integer` schema never yields "1.0")."""
    if isinstance(data, float) and data.is_integer() and abs(data) <= 2**53:
        return int(data)
    if isinstance(data, dict):
        return {k: _integral_floats_as_ints(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_integral_floats_as_ints(v) for v in data]
    return data


def serialize(data: Any, schema: Any, flexible: bool = False) -> str:
    """The instance as the engine emits it: schema key order, shortest numbers, compact (or `, `/`: `)."""
    seps = (", ", ": ") if flexible else (",", ":")
    return json.dumps(_integral_floats_as_ints(emit_order(data, schema)), separators=seps, ensure_ascii=False)


@dataclass
class Report:
    backend: str
    note: str = ""
    schemas: int = 0
    compiled: int = 0
    compile_errors: list[str] = field(default_factory=list)
    valid_total: int = 0
    valid_accepted: int = 0
    invalid_total: int = 0
    invalid_rejected: int = 0
    valid_rejected: list[str] = field(default_factory=list)
    invalid_accepted: list[str] = field(default_factory=list)
    mask_mismatches: list[str] = field(default_factory=list)
    flexible_total: int = 0
    flexible_accepted: int = 0
    flexible_rejected: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    claimed: int = 0  # compiled schemas whose every keyword the backend's coverage claims to enforce
    claim_violations: list[str] = field(default_factory=list)  # invalid instances those accept
    seconds: float = 0.0

    @property
    def valid_rate(self) -> float:
        return self.valid_accepted / max(1, self.valid_total)

    @property
    def invalid_rate(self) -> float:
        return self.invalid_rejected / max(1, self.invalid_total)

    def render(self, limit: int = 400) -> str:
        lines = [
            f"== JSON-Schema-Test-Suite on {self.backend} {self.note}",
            f"schemas: {self.schemas}, compiled: {self.compiled}, failed to compile: {len(self.compile_errors)}, "
            f"not run: {len(self.skipped)} ({self.seconds:.1f} s)",
            f"valid accepted: {self.valid_accepted}/{self.valid_total} ({self.valid_rate:.1%})",
            f"invalid rejected: {self.invalid_rejected}/{self.invalid_total} ({self.invalid_rate:.1%})",
        ]
        if self.flexible_total:
            lines.append(f"valid (compact-accepted) also accepted with flexible whitespace (', ' ': '): "
                         f"{self.flexible_accepted}/{self.flexible_total}")
        lines.append(f"bitmask/accept mismatches: {len(self.mask_mismatches)}")
        lines.append(f"schemas whose keywords the coverage table claims: {self.claimed}; invalid instances they "
                     f"accept: {len(self.claim_violations)}")
        by_kw = Counter(e.split(":", 1)[0] for e in self.invalid_accepted)
        lines.append("invalid instances accepted (constraint not enforced), by keyword file: "
                     + ", ".join(f"{k} {n}" for k, n in by_kw.most_common()))
        for title, items in (("schemas not run", self.skipped),
                             ("schemas that failed to compile", self.compile_errors),
                             ("valid instances rejected", self.valid_rejected),
                             ("invalid instances accepted", self.invalid_accepted),
                             ("valid instances rejected in flexible-whitespace mode", self.flexible_rejected),
                             ("bitmask mismatches", self.mask_mismatches),
                             ("invalid instances accepted by claimed schemas", self.claim_violations)):
            lines.append(f"-- {title} ({len(items)}):")
            lines += [f"   {x}"[:limit] for x in items]
        return "\n".join(lines)


def _walk(backend: GrammarBackend, compiled: Any, ids: list[int], check_mask: bool) -> tuple[bool, str | None]:
    """Feed `ids`; return (accepted to the end and can terminate, mask mismatch description)."""
    g = backend.matcher(compiled)
    mask = allocate_bitmask(1, backend.vocab_size)
    for i, tid in enumerate(ids):
        if check_mask:
            g.fill_bitmask(mask, 0)
            allowed = bool((int(mask[0, tid // 32]) >> (tid % 32)) & 1)
        ok = g.accept_token(tid)
        if check_mask and allowed != ok:
            return ok, f"token #{i} ({tid}): mask says {allowed}, accept_token says {ok}"
        if not ok:
            return False, None
    if check_mask:
        g.fill_bitmask(mask, 0)
        eos = backend.stop_token_ids[0]
        allowed = bool((int(mask[0, eos // 32]) >> (eos % 32)) & 1)
        if allowed != g.can_terminate():
            return g.can_terminate(), f"end: EOS bit {allowed} but can_terminate {g.can_terminate()}"
    return g.can_terminate(), None


def run_suite(
    backend: GrammarBackend,
    tokenizer: Any,
    instances: list[Instance],
    note: str = "",
    flexible: bool = False,
    skip: Callable[[ConstraintSpec], str | None] | None = None,
    coverage: Coverage | None = None,
) -> Report:
    """Compile each distinct schema once, then walk each of its instances.

    flexible: also walk valid instances serialized with `", "` / `": "` through the any-whitespace
        grammar. skip: returns a reason not to run a spec (reported), e.g. one too slow to compile.
    coverage: the backend's declared keyword coverage; invalid instances accepted by a schema it
        claims in full are listed apart (`claim_violations`: each is a wrong claim).
    """
    t0 = time.perf_counter()
    rep = Report(backend.name, note)
    by_schema: dict[str, list[Instance]] = {}
    for inst in instances:
        by_schema.setdefault(json.dumps(inst.schema, sort_keys=True), []).append(inst)
    rep.schemas = len(by_schema)
    for group in by_schema.values():
        head = group[0]
        label = f"{head.file}: {head.case}"
        try:
            spec = json_schema_spec(head.schema)
            reason = skip(spec) if skip else None
            if reason:
                rep.skipped.append(f"{label}: {reason}")
                continue
            compiled = backend.compile(spec)
        except GrammarError as e:
            rep.compile_errors.append(f"{label}: {e}")
            continue
        rep.compiled += 1
        claimed = coverage is not None and not coverage.unenforced(json.loads(spec.spec))
        rep.claimed += claimed
        flex = None
        for inst in group:
            text = serialize(inst.data, inst.schema)
            ids = tokenizer.encode(text, add_special_tokens=False)
            ok, mismatch = _walk(backend, compiled, ids, check_mask=inst.valid)
            where = f"{inst.file}: {inst.case} / {inst.test}: {text}"
            if mismatch:
                rep.mask_mismatches.append(f"{where}: {mismatch}")
            if not inst.valid:
                rep.invalid_total += 1
                rep.invalid_rejected += not ok
                if ok:
                    rep.invalid_accepted.append(where)
                    if claimed:
                        rep.claim_violations.append(where)
                continue
            rep.valid_total += 1
            rep.valid_accepted += ok
            if not ok:
                rep.valid_rejected.append(where)
            elif flexible and isinstance(inst.data, (dict, list)) and inst.data:
                if flex is None:
                    flex = backend.compile(ConstraintSpec("json_schema", spec.spec, any_whitespace=True))
                ftext = serialize(inst.data, inst.schema, flexible=True)
                rep.flexible_total += 1
                fok = _walk(backend, flex, tokenizer.encode(ftext, add_special_tokens=False), False)[0]
                rep.flexible_accepted += fok
                if not fok:
                    rep.flexible_rejected.append(f"{inst.file}: {inst.case} / {inst.test}: {ftext}")
    rep.seconds = time.perf_counter() - t0
    return rep
