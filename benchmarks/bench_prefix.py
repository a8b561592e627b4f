"""Prefix reuse (RadixAttention) benchmark: cache on vs off, radix-tree overhead, and a peer comparison with HF.

Measurements, all in one run on the default model (SmolLM2-135M, CPU, float32):

1. shared prefix: N=64 requests = one ~1,000-token few-shot prefix + a distinct ~50-token question each,
   16 new tokens each (greedy, ignore_eos), submitted together as one `generate` list. Wall time with the
   radix cache on vs `Engine(disable_radix_cache=True)`; target off/on >= 5x. Hit rate is
   sum(cached_tokens) / sum(prompt_tokens) (from each result's meta_info); its theoretical maximum is
   (N - 1) * P / sum(prompt_tokens), P = the prompts' longest common token prefix (the prefix computed once,
   reused by every other request); target hit_rate / max >= 0.95. A variant sends one request first and the
   other N - 1 after it finishes ("warm_first"); both variants are reported.
2. tree overhead: 64 distinct random-token prompts (no reuse possible), 16 new tokens, cache on. The
   RadixCache instance methods (match_prefix, insert, cache_finished_req, cache_unfinished_req, evict,
   inc_lock_ref, dec_lock_ref) are wrapped with a perf_counter timer (nested calls counted once);
   target tree time / engine wall time <= 2%.
3. peer: 16 requests of (the same prefix + 50 own tokens), 64 new tokens each. Our wall time vs HF
   transformers `generate` on the same token ids (left-padded batch, attention mask, greedy,
   min_new_tokens = max_new_tokens) and vs HF with the prefix KV computed once and copied to every row
   (DynamicCache.batch_repeat_interleave). Targets: ours >= 8x HF plain and >= 3x HF with the copied prefix.
   The machine's speed drifts over minutes, so after HF plain (once; it also warms HF up) ours (a
   fresh engine each round, shut down after it) and HF-copied alternate for `--peer-rounds` rounds
   (default 2) and the ratios use the mean walls. HF loads and runs on short-lived threads, so no
   idle OpenMP team of either side is left beside the other (see `radixgen.runtime.threads`). Also
   reports how many rows produce the same tokens as HF plain (a sanity check, not a target).

Prints one JSON line per measurement and a final summary line with the ratios and whether each target is met.
`--quick` shrinks everything (prefix 300 tokens, 8 requests, 16 new tokens) to check that the script works.
Usage: python benchmarks/bench_prefix.py [--quick] [--skip-hf] [--requests 64] [--prefix-tokens 1000] ...
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes: prefix 300, 8 requests, 16 new tokens")
    ap.add_argument("--prefix-tokens", type=int, help="shared few-shot prefix length (default 1000)")
    ap.add_argument("--question-tokens", type=int, help="own tokens per request (default 50)")
    ap.add_argument("--requests", type=int, help="requests in the shared-prefix case (default 64)")
    ap.add_argument("--new-tokens", type=int, help="new tokens per request, shared-prefix case (default 16)")
    ap.add_argument("--noreuse-requests", type=int, help="prompts in the no-reuse case (default 64)")
    ap.add_argument("--noreuse-prompt-tokens", type=int, help="tokens per no-reuse prompt (default 256)")
    ap.add_argument("--peer-requests", type=int, help="requests in the peer case (default 16)")
    ap.add_argument("--peer-new-tokens", type=int, help="new tokens per request, peer case (default 64)")
    ap.add_argument("--peer-rounds", type=int, default=2,
                    help="peer case: rounds of ours then HF with the copied prefix (default 2); ratios use the means")
    ap.add_argument("--skip-hf", action="store_true", help="skip the HF transformers runs (the slow part)")
    ap.add_argument("--threads", type=int, help="torch CPU threads for both engines and HF (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and bad flags answer before torch is imported

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixgen.runtime.engine import Engine  # noqa: E402
from radixgen.runtime.threads import on_short_lived_thread  # noqa: E402

TREE_METHODS = ("match_prefix", "insert", "cache_finished_req", "cache_unfinished_req", "evict",
                "inc_lock_ref", "dec_lock_ref")
WORDS = ("river apple stone cloud garden silver window market orange forest engine paper bridge candle "
         "harbor pencil winter summer valley rocket violin castle meadow copper island lantern mirror "
         "planet saddle thunder velvet whistle anchor basket desert falcon glacier hammer jungle kettle "
         "ladder marble needle oyster parrot quartz ribbon shadow tunnel umbrella walnut yellow zebra").split()
CAPITALS = (("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Egypt", "Cairo"),
            ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Canada", "Ottawa"), ("Norway", "Oslo"), ("Chile", "Santiago"))


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------------------------------------- workload


def encode(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def few_shot_prefix(tok: Any, n_tokens: int, rng: random.Random) -> list[int]:
    """A few-shot prompt (instructions + worked examples), cut to exactly n_tokens tokens."""
    parts = ["You are a careful assistant. Answer each question in one short sentence, "
             "following the style of the examples below.\n\n"]
    i = 0
    while len(encode(tok, "".join(parts))) < n_tokens + 8:
        kind = i % 3
        if kind == 0:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            parts.append(f"Question: What is {a} plus {b}?\nAnswer: {a} plus {b} is {a + b}.\n\n")
        elif kind == 1:
            country, city = CAPITALS[rng.randrange(len(CAPITALS))]
            parts.append(f"Question: What is the capital of {country}?\n"
                         f"Answer: The capital of {country} is {city}.\n\n")
        else:
            w = rng.sample(WORDS, 3)
            parts.append(f"Question: Which word comes first alphabetically: {w[0]}, {w[1]} or {w[2]}?\n"
                         f"Answer: {min(w)} comes first.\n\n")
        i += 1
    return encode(tok, "".join(parts))[:n_tokens]


def question(tok: Any, n_tokens: int, idx: int, rng: random.Random) -> list[int]:
    """A distinct question of exactly n_tokens tokens (its first words differ between requests)."""
    words = [WORDS[(idx * 7 + k) % len(WORDS)] for k in range(2)] + rng.choices(WORDS, k=4 * n_tokens)
    text = f"Question {idx}: " + " ".join(words[:2]) + " story: " + " ".join(words[2:]) + "?"
    ids = encode(tok, text)
    assert len(ids) >= n_tokens, "question text too short"
    return ids[:n_tokens - 3] + encode(tok, "\nAnswer:")[:3]


def common_prefix_len(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        t = seqs[0][i]
        if any(s[i] != t for s in seqs):
            return i
    return n


def gen_params(new_tokens: int) -> dict[str, Any]:
    return {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}


# ---------------------------------------------------------------------------------------------- engine


def warm_up(eng: Engine, rng: random.Random) -> None:
    ids = [rng.randrange(1000, 40000) for _ in range(64)]
    eng.generate(input_ids=ids, sampling_params=gen_params(4))
    eng.flush_cache()


def hit_stats(results: list[dict], shared: int) -> dict[str, Any]:
    prompt = sum(r["meta_info"]["prompt_tokens"] for r in results)
    cached = [r["meta_info"]["cached_tokens"] for r in results]
    hit = sum(cached) / prompt
    best = (len(results) - 1) * shared / prompt
    return {
        "prompt_tokens": prompt,
        "cached_tokens": sum(cached),
        "hit_rate": round(hit, 4),
        "max_hit_rate": round(best, 4),
        "hit_rate_vs_max": round(hit / best, 4) if best else None,
        "reqs_full_prefix_hit": sum(c >= shared for c in cached),
        "reqs_zero_hit": sum(c == 0 for c in cached),
        "cached_min_median_max": [min(cached), int(statistics.median(cached)), max(cached)],
    }


def stats_delta(before: dict, after: dict) -> dict[str, Any]:
    computed = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    return {"engine_computed_prompt_tokens": computed, "engine_cached_prompt_tokens": cached,
            "retractions": after["retractions"] - before["retractions"]}


def run_batch(eng: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[dict], dict]:
    before = eng.get_stats()
    t = time.perf_counter()
    out = eng.generate(input_ids=prompts, sampling_params=gen_params(new_tokens))
    wall = time.perf_counter() - t
    assert isinstance(out, list)
    assert all(len(r["output_ids"]) == new_tokens for r in out), "a request stopped early"
    return wall, out, stats_delta(before, eng.get_stats())


def run_warm_first(eng: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, float, list[dict], dict]:
    before = eng.get_stats()
    t = time.perf_counter()
    first = eng.generate(input_ids=prompts[0], sampling_params=gen_params(new_tokens))
    t_first = time.perf_counter() - t
    rest = eng.generate(input_ids=prompts[1:], sampling_params=gen_params(new_tokens))
    wall = time.perf_counter() - t
    assert isinstance(first, dict) and isinstance(rest, list)
    return wall, t_first, [first, *rest], stats_delta(before, eng.get_stats())


class TreeTimer:
    """Times the RadixCache's methods by shadowing them with wrappers on the instance (scheduler thread only;
    a call made from inside another timed call, e.g. insert inside cache_finished_req, is not counted twice)."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree
        self.total = 0.0
        self.calls: dict[str, int] = {m: 0 for m in TREE_METHODS}
        self.per_method: dict[str, float] = {m: 0.0 for m in TREE_METHODS}
        self._depth = 0

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t
                self._depth -= 1
                self.total += dt
                self.per_method[name] += dt
                self.calls[name] += 1

        return timed

    def __enter__(self) -> TreeTimer:
        for m in TREE_METHODS:
            setattr(self.tree, m, self._wrap(m, getattr(self.tree, m)))
        return self

    def __exit__(self, *exc: object) -> None:
        for m in TREE_METHODS:
            delattr(self.tree, m)  # back to the class's methods


# ---------------------------------------------------------------------------------------------- HF


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (n - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def hf_kwargs(new_tokens: int, pad: int) -> dict[str, Any]:
    return dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad)


def hf_plain(model: Any, prompts: list[list[int]], new_tokens: int, pad: int) -> tuple[float, list[list[int]]]:
    ids, mask = left_pad(prompts, pad)
    with torch.no_grad():
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, **hf_kwargs(new_tokens, pad))
        wall = time.perf_counter() - t
    return wall, out[:, ids.shape[1]:].tolist()


def hf_copied_prefix(model: Any, prompts: list[list[int]], shared: int, new_tokens: int,
                     pad: int) -> tuple[float, list[list[int]]]:
    """Prefix KV computed once (batch 1), repeated to the batch, then generate the rest. Rows whose suffixes
    differ in length are padded between the prefix and the suffix (the mask zeros there; positions come from
    the mask's cumsum)."""
    prefix = torch.tensor([prompts[0][:shared]])
    tails, tail_mask = left_pad([p[shared:] for p in prompts], pad)
    b = len(prompts)
    ids = torch.cat([prefix.expand(b, -1), tails], dim=1)
    mask = torch.cat([torch.ones(b, shared, dtype=tail_mask.dtype), tail_mask], dim=1)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        t = time.perf_counter()
        out = model(prefix, use_cache=True)
        cache = out.cache if cache_kw == "cache" else out.past_key_values
        cache.batch_repeat_interleave(b)  # copies the prefix KV into every row
        gen = model.generate(ids, attention_mask=mask, **{cache_kw: cache}, **hf_kwargs(new_tokens, pad))
        wall = time.perf_counter() - t
    return wall, gen[:, ids.shape[1]:].tolist()


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    args = build_parser().parse_args()
    quick = args.quick
    prefix_n = args.prefix_tokens or (300 if quick else 1000)
    q_n = args.question_tokens or 50
    n_req = args.requests or (8 if quick else 64)
    new_n = args.new_tokens or 16
    nr_req = args.noreuse_requests or (16 if quick else 64)
    nr_len = args.noreuse_prompt_tokens or (64 if quick else 256)
    peer_req = args.peer_requests or (8 if quick else 16)
    peer_new = args.peer_new_tokens or (16 if quick else 64)
    rng = random.Random(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    common = {"bench": "prefix", "threads": torch.get_num_threads()}

    pool = max(n_req * (prefix_n + q_n + new_n), peer_req * (prefix_n + q_n + peer_new),
               nr_req * (nr_len + new_n)) + 2048
    t = time.perf_counter()
    eng = Engine(disable_radix_cache=False, max_total_tokens=pool, num_threads=args.threads)
    tok = eng.tokenizer
    emit({**common, "case": "load", "engine": "radix_on", "load_s": round(time.perf_counter() - t, 2),
          "max_total_tokens": pool, "loadavg": os.getloadavg()})
    prefix = few_shot_prefix(tok, prefix_n, rng)
    prompts = [prefix + question(tok, q_n, i, rng) for i in range(n_req)]
    shared = common_prefix_len(prompts)
    peer_prompts = [prefix + question(tok, q_n, 1000 + i, rng) for i in range(peer_req)]
    peer_shared = common_prefix_len(peer_prompts)
    noreuse = [[rng.randrange(1000, 40000) for _ in range(nr_len)] for _ in range(nr_req)]
    assert common_prefix_len(noreuse) == 0
    summary: dict[str, Any] = {**common, "case": "summary", "quick": quick}

    # 1. shared prefix, cache on (together, then warm-first), 2. tree overhead
    try:
        warm_up(eng, rng)
        wall_on, res, delta = run_batch(eng, prompts, new_n)
        hs_on = hit_stats(res, shared)
        emit({**common, "case": "shared_prefix", "engine": "radix_on", "mode": "together", "requests": n_req,
              "prefix_tokens": len(prefix), "shared_tokens": shared, "new_tokens": new_n,
              "wall_s": round(wall_on, 3), **hs_on, **delta})
        eng.flush_cache()
        wall_wf, t_first, res, delta = run_warm_first(eng, prompts, new_n)
        hs_wf = hit_stats(res, shared)
        emit({**common, "case": "shared_prefix", "engine": "radix_on", "mode": "warm_first", "requests": n_req,
              "prefix_tokens": len(prefix), "shared_tokens": shared, "new_tokens": new_n,
              "wall_s": round(wall_wf, 3), "first_req_s": round(t_first, 3), **hs_wf, **delta})
        eng.flush_cache()

        with TreeTimer(eng.scheduler.tree) as timer:
            wall_nr, res, delta = run_batch(eng, noreuse, new_n)
        overhead = timer.total / wall_nr
        emit({**common, "case": "tree_overhead", "engine": "radix_on", "requests": nr_req, "prompt_tokens": nr_len,
              "new_tokens": new_n, "wall_s": round(wall_nr, 3), "tree_s": round(timer.total, 4),
              "tree_fraction": round(overhead, 5), "calls": timer.calls,
              "per_method_ms": {k: round(v * 1e3, 2) for k, v in timer.per_method.items()},
              "cached_tokens": sum(r["meta_info"]["cached_tokens"] for r in res), **delta})
    finally:
        eng.shutdown()
    del eng
    gc.collect()

    # 1. shared prefix, cache off
    eng = Engine(disable_radix_cache=True, max_total_tokens=pool, num_threads=args.threads)
    try:
        warm_up(eng, rng)
        wall_off, res, delta = run_batch(eng, prompts, new_n)
        emit({**common, "case": "shared_prefix", "engine": "radix_off", "mode": "together", "requests": n_req,
              "wall_s": round(wall_off, 3), "cached_tokens": sum(r["meta_info"]["cached_tokens"] for r in res),
              **delta})
    finally:
        eng.shutdown()
    del eng
    gc.collect()

    summary.update({
        "off_on_ratio": round(wall_off / wall_on, 2), "off_on_target": 5.0, "off_on_ok": wall_off / wall_on >= 5,
        "off_on_ratio_warm_first": round(wall_off / wall_wf, 2),
        "hit_rate_vs_max": hs_on["hit_rate_vs_max"], "hit_rate_vs_max_warm_first": hs_wf["hit_rate_vs_max"],
        "hit_rate_target": 0.95, "hit_rate_ok": (hs_on["hit_rate_vs_max"] or 0) >= 0.95,
        "hit_rate_ok_warm_first": (hs_wf["hit_rate_vs_max"] or 0) >= 0.95,
        "tree_fraction": round(overhead, 5), "tree_target": 0.02, "tree_ok": overhead <= 0.02,
    })

    # 3. peer case: ours and HF with the copied prefix alternate for --peer-rounds rounds (the machine's
    # speed drifts over minutes; alternating keeps both sides under the same conditions); HF plain once.
    # HF loads and runs on short-lived threads and each round's engine is shut down before HF runs, so
    # neither side runs beside the other's idle OpenMP team (see radixgen.runtime.threads).
    model = None
    if not args.skip_hf:
        import transformers

        from radixgen.runtime.models.resolve import default_model_path

        p = default_model_path()
        t = time.perf_counter()
        model = on_short_lived_thread(lambda: transformers.AutoModelForCausalLM.from_pretrained(
            str(p.parent), gguf_file=p.name, dtype=torch.float32).eval())
        pad = tok.eos_token_ids[0] if tok.eos_token_ids else 0
        emit({**common, "case": "load", "engine": "hf", "load_s": round(time.perf_counter() - t, 2)})

        def hf_warm_up() -> None:
            with torch.no_grad():
                model.generate(torch.tensor([prefix[:32]]), **hf_kwargs(2, pad))

        on_short_lived_thread(hf_warm_up)
        # HF plain first: it also warms HF's allocator up for the timed copied-prefix rounds
        # (run cold, the first copied-prefix run took 32 s instead of 20-23 s)
        wall_hf, hf_out = on_short_lived_thread(lambda: hf_plain(model, peer_prompts, peer_new, pad))
        emit({**common, "case": "peer", "engine": "hf_plain", "requests": peer_req, "new_tokens": peer_new,
              "wall_s": round(wall_hf, 3)})
    ours_walls, hfc_walls = [], []
    for rnd in range(args.peer_rounds):
        eng = Engine(max_total_tokens=pool, num_threads=args.threads)
        try:
            warm_up(eng, rng)  # ends with the cache flushed
            wall_peer, peer_res, delta = run_batch(eng, peer_prompts, peer_new)
        finally:
            eng.shutdown()
        ours_walls.append(wall_peer)
        emit({**common, "case": "peer", "engine": "radix_on", "round": rnd, "requests": peer_req,
              "shared_tokens": peer_shared, "new_tokens": peer_new, "wall_s": round(wall_peer, 3),
              **hit_stats(peer_res, peer_shared), **delta})
        if model is not None:
            wall_hfc, hfc_out = on_short_lived_thread(
                lambda: hf_copied_prefix(model, peer_prompts, peer_shared, peer_new, pad))
            hfc_walls.append(wall_hfc)
            emit({**common, "case": "peer", "engine": "hf_copied_prefix", "round": rnd, "requests": peer_req,
                  "new_tokens": peer_new, "prefix_tokens": peer_shared, "wall_s": round(wall_hfc, 3)})
    if model is not None:
        ours_out = [r["output_ids"] for r in peer_res]
        same = sum(a == b for a, b in zip(ours_out, hf_out, strict=True))
        same_c = sum(a == b for a, b in zip(hfc_out, hf_out, strict=True))
        ours_mean, hfc_mean = statistics.mean(ours_walls), statistics.mean(hfc_walls)
        summary.update({
            "peer_rounds": args.peer_rounds,
            "hf_plain_ratio": round(wall_hf / ours_mean, 2), "hf_plain_target": 8.0,
            "hf_plain_ok": wall_hf / ours_mean >= 8,
            "hf_copied_ratio": round(hfc_mean / ours_mean, 2), "hf_copied_target": 3.0,
            "hf_copied_ok": hfc_mean / ours_mean >= 3,
            "hf_copied_ratio_per_round": [round(h / o, 2) for h, o in zip(hfc_walls, ours_walls, strict=True)],
            "peer_rows_equal_ours_vs_hf": f"{same}/{peer_req}",
            "peer_rows_equal_hf_copied_vs_hf": f"{same_c}/{peer_req}",
        })
    summary["loadavg"] = os.getloadavg()
    emit(summary)


if __name__ == "__main__":
    main()
