"""Grammar compile and mask-fill cost per backend, ours beside the raw libraries, in one run.

Schemas: the JSON-Schema-Test-Suite subset in shared/data (set RADIXGEN_SHARED, or run from a
checkout beside `shared/`), remote $refs left out. Per backend (llguidance, XGrammar, outlines-core):
- compile: ours (`backend.compile(spec)`: normalization, our format regexes, closed objects, then
  the library) vs the raw library on the schema as given (llguidance: `grammar_from_json_schema` +
  `LLMatcher`; XGrammar: `GrammarCompiler.compile_json_schema` on a `from_huggingface` tokenizer
  info; outlines-core: `build_regex_from_schema` + `Index` on a plain vocabulary). outlines-core
  compiles run in forked child processes under `--timeout` seconds (its index build can take
  minutes and cannot be interrupted); the others in-process. Reported: p50 / p99 ms over the
  schemas both compiled, how many exceed the timeout, and any schema over the timeout for us that
  the raw library compiles in less (target: none).
- mask: microseconds per `fill_bitmask` into row 3 of an 8-row batch bitmask while walking each
  valid instance token by token, ours (`Grammar.fill_bitmask`) vs raw (the library's own fill:
  `llguidance.torch.fill_next_token_bitmask`, `GrammarMatcher.fill_next_token_bitmask`,
  `outlines_core.kernels.torch.fill_next_token_bitmask` on the same row). The raw library gets the
  same grammar as ours here (the schema after `narrow.py`), so the ratio is the wrapper's cost;
  each walk is done once untimed first (lazily built library state is then warm for both), and
  the timed walks alternate which side goes first. Over the tokens both accept: p50 / p99 and the
  ratios ours / raw (target: <= 1.2).
Prints one JSON line per backend. Timing on a shared machine is noisy: compare the ratios, which
are measured side by side.

Usage: python benchmarks/bench_grammar_compile.py [--backends llguidance,xgrammar,outlines]
       [--timeout 10] [--max-schemas N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "grammar"))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def load_schemas(limit: int | None) -> list[tuple[str, Any, list[Any]]]:
    """(label, schema, valid instances) per distinct schema of the suite."""
    from jsonschema_suite import load_instances, suite_dir

    root = suite_dir()
    if root is None:
        sys.exit("shared/data/json-schema-test-suite not found: set RADIXGEN_SHARED")
    groups: dict[str, tuple[str, Any, list[Any]]] = {}
    for inst in load_instances(root)[0]:
        key = json.dumps(inst.schema, sort_keys=True)
        groups.setdefault(key, (f"{inst.file}: {inst.case}", inst.schema, []))
        if inst.valid:
            groups[key][2].append(inst.data)
    out = list(groups.values())
    return out[:limit] if limit else out


# ---------------------------------------------------------------------------------------------- raw libraries


class RawLLGuidance:
    def __init__(self, tok: Any, vocab_size: int) -> None:
        import llguidance.hf

        self.tokenizer = llguidance.hf.from_tokenizer(tok.hf, n_vocab=vocab_size, eos_token=tok.eos_token_ids)

    def compile(self, schema: Any) -> Any:
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})
        m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def walk(self, compiled: Any, ids: list[int], bitmask: Any) -> tuple[list[float], int]:
        import llguidance.torch

        m = compiled.deep_copy()
        return _timed_walk(ids, lambda: llguidance.torch.fill_next_token_bitmask(m, bitmask, 3),
                           lambda t: m.try_consume_tokens([t]) == 1)


class RawXGrammar:
    def __init__(self, tok: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tok.hf, vocab_size=vocab_size, stop_token_ids=tok.eos_token_ids)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)

    def compile(self, schema: Any) -> Any:
        return self.compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"),
                                                 strict_mode=True)

    def walk(self, compiled: Any, ids: list[int], bitmask: Any) -> tuple[list[float], int]:
        import xgrammar as xgr

        m = xgr.GrammarMatcher(compiled)
        return _timed_walk(ids, lambda: m.fill_next_token_bitmask(bitmask, 3), m.accept_token)


class RawOutlines:
    def __init__(self, tok: Any, vocab_size: int) -> None:
        import outlines_core

        from radixgen.grammar.vocab import cached_token_bytes

        groups: dict[bytes, list[int]] = {}
        for idx, data in enumerate(cached_token_bytes(tok.hf, vocab_size)):
            if data:
                groups.setdefault(data, []).append(idx)
        self.vocabulary = outlines_core.Vocabulary(tok.eos_token_ids[0], groups)

    def compile(self, schema: Any) -> Any:
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema

        return outlines_core.Index(build_regex_from_schema(schema, whitespace_pattern=""), self.vocabulary)

    def walk(self, compiled: Any, ids: list[int], bitmask: Any) -> tuple[list[float], int]:
        import outlines_core
        from outlines_core.kernels.torch import fill_next_token_bitmask

        guide, row = outlines_core.Guide(compiled), bitmask[3:4]

        def accept(t: int) -> bool:
            if compiled.get_next_state(guide.get_state(), t) is None:
                return False
            guide.advance(t, False)
            return True

        return _timed_walk(ids, lambda: fill_next_token_bitmask(guide, row), accept)


RAW = {"llguidance": RawLLGuidance, "xgrammar": RawXGrammar, "outlines": RawOutlines}


def _timed_walk(ids: list[int], fill: Callable[[], None], accept: Callable[[int], bool]) -> tuple[list[float], int]:
    """Seconds of each fill along `ids` (a fill before each token), and how many tokens were accepted."""
    times = []
    for n, tid in enumerate(ids):
        t = time.perf_counter()
        fill()
        times.append(time.perf_counter() - t)
        if not accept(tid):
            return times, n
    return times, len(ids)


def ours_walk(backend: Any, compiled: Any, ids: list[int], bitmask: Any) -> tuple[list[float], int]:
    g = backend.matcher(compiled)
    return _timed_walk(ids, lambda: g.fill_bitmask(bitmask, 3), g.accept_token)


def walk_pair(ours: Any, c_ours: Any, raw: Any, c_raw: Any, ids: list[int], bitmask: Any,
              ours_first: bool) -> dict[str, list[float]]:
    """Fill times of ours and raw along `ids` after an untimed warm-up walk of each, over the
    tokens both accept (and the fill after them)."""
    walks = {"ours": (ours_walk, ours, c_ours), "raw": (lambda _, c, i, b: raw.walk(c, i, b), raw, c_raw)}
    for fn, backend, compiled in walks.values():
        fn(backend, compiled, ids, bitmask)
    timed = {who: walks[who][0](walks[who][1], walks[who][2], ids, bitmask)
             for who in (("ours", "raw") if ours_first else ("raw", "ours"))}
    n = min(timed["ours"][1], timed["raw"][1]) + 1
    return {who: times[:n] for who, (times, _) in timed.items()}


# ---------------------------------------------------------------------------------------------- compile timing


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _child(fn: Callable[[], Any], conn: Any) -> None:
    try:
        seconds, _ = _timed(fn)
        conn.send(("ok", seconds))
    except Exception as e:  # a compile error is a result too
        conn.send(("error", str(e)[:100]))


def compile_in_child(fn: Callable[[], Any], timeout: float) -> tuple[str, float | str]:
    """("ok", seconds) | ("error", message) | ("timeout", timeout), running `fn` in a forked process."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, child))
    proc.start()
    if parent.poll(timeout):
        result = parent.recv()
        proc.join()
        return result
    proc.kill()
    proc.join()
    return "timeout", timeout


def same_grammar(name: str, spec: Any) -> str:
    """The schema text our backend hands its library (after normalization and `narrow.py`)."""
    from radixgen.grammar.narrow import lower_formats, narrow

    schema = json.loads(spec.spec)
    return json.dumps(lower_formats(schema) if name == "xgrammar" else narrow(schema))


def bench_backend(name: str, schemas: list, tok: Any, timeout: float) -> dict:
    from jsonschema_suite import serialize

    from radixgen.grammar import GrammarError, allocate_bitmask, json_schema_spec, make_backend

    vocab = tok.vocab_size
    ours, raw = make_backend(name, tok, vocab), RAW[name](tok, vocab)
    bitmask = allocate_bitmask(8, vocab)
    compile_ms: dict[str, list[float]] = {"ours": [], "raw": []}
    over = {"ours": 0, "raw": 0}
    slow_only_ours, compiled_both = [], 0
    fills: dict[str, list[float]] = {"ours": [], "raw": []}
    for label, schema, valid in schemas:
        try:
            spec = json_schema_spec(schema)
        except GrammarError:
            continue
        results = {}
        given = json.dumps(schema)
        for who, fn in (("ours", lambda s=spec: ours.compile(s)), ("raw", lambda s=given: raw.compile(s))):
            if name == "outlines":
                results[who] = compile_in_child(fn, timeout)
            else:
                try:
                    results[who] = ("ok", _timed(fn)[0])
                except Exception as e:
                    results[who] = ("error", str(e)[:100])
        for who, (status, _) in results.items():
            over[who] += status == "timeout"
        if results["ours"][0] == "timeout" and results["raw"][0] == "ok":
            slow_only_ours.append(f"{label} (raw {results['raw'][1]:.1f} s)")
        if results["ours"][0] != "ok" or results["raw"][0] != "ok":
            continue
        compiled_both += 1
        for who in ("ours", "raw"):
            compile_ms[who].append(results[who][1] * 1e3)
        c_ours, c_raw = ours.compile(spec), raw.compile(same_grammar(name, spec))  # in-process, for the walks
        for i, data in enumerate(valid):
            ids = tok.encode(serialize(data, schema), add_special_tokens=False)
            for who, times in walk_pair(ours, c_ours, raw, c_raw, ids, bitmask, ours_first=bool(i % 2)).items():
                fills[who] += times
    us = {who: [s * 1e6 for s in v] for who, v in fills.items()}
    row = {"bench": "grammar_compile_and_mask", "backend": name, "schemas": len(schemas),
           "compiled_by_both": compiled_both, "timeout_s": timeout,
           "over_timeout_ours": over["ours"], "over_timeout_raw": over["raw"],
           "over_timeout_only_ours": slow_only_ours,
           "compile_ms_p50_ours": round(pct(compile_ms["ours"], 0.5), 3),
           "compile_ms_p50_raw": round(pct(compile_ms["raw"], 0.5), 3),
           "compile_ms_p99_ours": round(pct(compile_ms["ours"], 0.99), 3),
           "compile_ms_p99_raw": round(pct(compile_ms["raw"], 0.99), 3),
           "mask_fills": len(us["ours"]),
           "mask_us_p50_ours": round(pct(us["ours"], 0.5), 2), "mask_us_p50_raw": round(pct(us["raw"], 0.5), 2),
           "mask_us_p99_ours": round(pct(us["ours"], 0.99), 2), "mask_us_p99_raw": round(pct(us["raw"], 0.99), 2),
           "mask_us_mean_ours": round(statistics.fmean(us["ours"]), 2) if us["ours"] else None,
           "mask_us_mean_raw": round(statistics.fmean(us["raw"]), 2) if us["raw"] else None}
    if us["ours"] and us["raw"]:
        row["mask_ratio_p50"] = round(pct(us["ours"], 0.5) / pct(us["raw"], 0.5), 3)
        row["mask_ratio_p99"] = round(pct(us["ours"], 0.99) / pct(us["raw"], 0.99), 3)
    return row


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="llguidance,xgrammar,outlines")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per outlines-core compile")
    ap.add_argument("--max-schemas", type=int, default=None)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from radixgen.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer()
    schemas = load_schemas(args.max_schemas)
    for name in args.backends.split(","):
        print(json.dumps(bench_backend(name, schemas, tok, args.timeout)), flush=True)


if __name__ == "__main__":
    main()
