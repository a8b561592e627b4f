"""Grammar compile time and per-token mask-fill cost, both backends, on a typical tool-call schema.

Prints one JSON line per measurement:
- compile: first compile (fresh backend) and cached compile (a `GrammarCache` hit, and the
  backend compiled again: XGrammar's own compiler cache / outlines has none) in ms;
- mask_fill: mean microseconds per decode step to fill one bitmask row while walking a typical
  output token by token: ours (`Grammar.fill_bitmask`) vs raw XGrammar
  (`GrammarMatcher.fill_next_token_bitmask` on the same tensor), with the ratio ours / raw
  (target: <= 1.2, i.e. our wrapper adds little), and the outlines backend's figure.
Usage: python benchmarks/bench_grammar_compile.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import time


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    return ap


TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "include_hourly": {"type": "boolean"},
            },
            "required": ["location", "unit"],
        },
    },
    "required": ["name", "arguments"],
}
OUTPUT = {"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius", "days": 3,
                                               "include_hourly": False}}


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def bench_compile(name: str, tok) -> tuple[object, object]:
    from radixgen.grammar import GrammarCache, json_schema_spec, make_backend

    spec = json_schema_spec(TOOL_SCHEMA)
    t = time.perf_counter()
    backend = make_backend(name, tok)
    setup = time.perf_counter() - t
    cache = GrammarCache(backend)
    t = time.perf_counter()
    compiled = cache.get_or_compile(spec).result()
    first = time.perf_counter() - t
    t = time.perf_counter()
    cache.get_or_compile(spec).result()
    hit = time.perf_counter() - t
    t = time.perf_counter()
    backend.compile(spec)
    again = time.perf_counter() - t
    cache.shutdown()
    print(json.dumps({"bench": "grammar_compile", "backend": name, "backend_setup_ms": ms(setup),
                      "first_compile_ms": ms(first), "cache_hit_ms": ms(hit), "backend_recompile_ms": ms(again)}))
    return backend, compiled


def walk_fill(grammar, ids: list[int], mask, fill) -> float:
    """Seconds spent filling masks along `ids` (accepting each token after its fill)."""
    spent = 0.0
    for tid in ids:
        t = time.perf_counter()
        fill(mask)
        spent += time.perf_counter() - t
        assert grammar.accept_token(tid)
    return spent


def main() -> None:
    args = build_parser().parse_args()

    import xgrammar as xgr

    from radixgen.grammar import allocate_bitmask
    from radixgen.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer()
    ids = tok.encode(json.dumps(OUTPUT, separators=(",", ":")), add_special_tokens=False)
    steps = len(ids) * args.repeat
    results = {}
    for name in ("xgrammar", "outlines"):
        backend, compiled = bench_compile(name, tok)
        mask = allocate_bitmask(8, backend.vocab_size)
        spent = 0.0
        for _ in range(args.repeat):
            g = backend.matcher(compiled)
            spent += walk_fill(g, ids, mask, lambda m, g=g: g.fill_bitmask(m, 3))
        results[name] = spent / steps * 1e6
        if name == "xgrammar":
            raw = 0.0
            for _ in range(args.repeat):
                m = xgr.GrammarMatcher(compiled.handle)
                raw += walk_fill(m, ids, mask, lambda b, m=m: m.fill_next_token_bitmask(b, 3))
            results["raw_xgrammar"] = raw / steps * 1e6
    print(json.dumps({"bench": "grammar_mask_fill", "tokens_per_walk": len(ids), "walks": args.repeat,
                      "ours_xgrammar_us": round(results["xgrammar"], 2),
                      "raw_xgrammar_us": round(results["raw_xgrammar"], 2),
                      "ours_outlines_us": round(results["outlines"], 2),
                      "ratio_ours_over_raw_xgrammar": round(results["xgrammar"] / results["raw_xgrammar"], 3)}))


if __name__ == "__main__":
    main()
