"""Online-serving benchmark (offline, in-process): Poisson arrivals against one Engine at a time.

Two workloads, each run on two engine configurations, all in one run on the default model
(SmolLM2-135M, CPU, float32). Every configuration gets its own Engine: load, warm up, run, shut down.

1. mixed: N=200 requests (fixed seed) with Poisson arrivals at `--rate` req/s, prompts of 20-400
   random tokens (uniform) and 8-64 new tokens (uniform; greedy, ignore_eos). Run with the overlap
   schedule on vs `Engine(disable_overlap=True)` on the identical workload. Target: overlap / no-overlap
   output throughput >= 1.1x. The rate must exceed the engine's capacity so that a queue forms and
   throughput measures the engine, not the arrivals (below capacity both configurations keep up and
   their throughput equals the arrival rate). Default 4 req/s: on the 2-core CPU machine this was
   written on the engine serves about 2.2 req/s of this mix (prefill of the ~210-token prompts
   dominates), so the queue grows through the 50 s of arrivals. On a faster machine raise --rate.
2. shared-prefix: G=8 groups, each with its own 600-token prefix; N=64 requests, request i belongs
   to group i % G (arrivals interleave the groups, so first-come-first-served switches group at every
   request), each = its group's prefix + 20-60 own tokens, 8-32 new tokens, Poisson arrivals at a rate
   above capacity (a queue builds up, which is where the policy matters). The KV pool is small
   (`--prefix-max-total-tokens`, default 2550: about 3 prefixes plus the running requests), so the
   radix cache cannot hold every group at once (the pool defaults to 4.25 x the prefix length).
   schedule_policy="lpm" vs "fcfs". Target: lpm / fcfs output throughput >= 1.3x. (The scheduler falls
   back to fcfs order above 128 waiting requests, so N stays <= 128.)

Measured per configuration, client side (each request streams; times from the moment it is sent):
throughput = output tokens / (last finish - first send) and requests / the same span; TTFT = time to
the first chunk carrying output ids; ITL = gaps between consecutive chunks carrying output ids (a chunk
with k ids counts as k gaps of gap/k). p50/p99 of TTFT and ITL in ms. Also the engine's cache hit rate,
retraction count and worker busy time (`worker_busy_seconds`: forward + sampling) from `get_stats()`.
The summary's `overlap_upper_bound` is the no-overlap run's duration over its worker busy time: the
throughput ratio overlap would reach if it hid every gap between forwards (all host work).

Prints one JSON line per configuration and a final summary line with the ratios and whether each
target is met. `--quick` shrinks both workloads (40 mixed requests; 24 shared-prefix requests with
300-token prefixes and a 1275-token pool) to check that the script works.
Usage: python benchmarks/bench_serving.py [--quick] [--rate 4] [--requests 200] [--prefix-requests 64] ...
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (40 mixed; 24 shared-prefix, 300-token prefixes)")
    ap.add_argument("--requests", type=int, help="mixed-workload requests (default 200; quick 40)")
    ap.add_argument("--rate", type=float, default=4.0, help="mixed-workload arrival rate, req/s (default 4)")
    ap.add_argument("--prefix-requests", type=int, help="shared-prefix requests, <= 128 (default 64; quick 24)")
    ap.add_argument("--prefix-groups", type=int, default=8, help="shared-prefix groups (default 8)")
    ap.add_argument("--prefix-tokens", type=int, help="tokens of each group's prefix (default 600; quick 300)")
    ap.add_argument("--prefix-rate", type=float, default=20.0,
                    help="shared-prefix arrival rate, req/s (default 20: above capacity)")
    ap.add_argument("--prefix-max-total-tokens", type=int,
                    help="KV pool of the shared-prefix engines (default 4.25 x --prefix-tokens: 2550)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--skip-overlap", action="store_true", help="skip the overlap on/off workload")
    ap.add_argument("--skip-prefix", action="store_true", help="skip the lpm/fcfs workload")
    ap.add_argument("--seed", type=int, default=0)
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and bad flags answer before torch is imported

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixgen.runtime.engine import Engine  # noqa: E402

TOKEN_RANGE = (1000, 40000)  # ordinary vocabulary ids of SmolLM2 (no special tokens)


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------------------------------------- workload


@dataclass
class Request:
    arrival: float  # seconds after the start of the run
    input_ids: list[int]
    new_tokens: int


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


def poisson_times(rng: random.Random, n: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def mixed_workload(n: int, rate: float, seed: int, prompt_range: tuple[int, int],
                   output_range: tuple[int, int]) -> list[Request]:
    rng = random.Random(seed)
    times = poisson_times(rng, n, rate)
    return [Request(t, random_ids(rng, rng.randint(*prompt_range)), rng.randint(*output_range)) for t in times]


def shared_prefix_workload(n: int, groups: int, prefix_tokens: int, rate: float, seed: int,
                           own_range: tuple[int, int], output_range: tuple[int, int]) -> list[Request]:
    rng = random.Random(seed + 1)
    prefixes = [random_ids(rng, prefix_tokens) for _ in range(groups)]
    times = poisson_times(rng, n, rate)
    return [Request(t, prefixes[i % groups] + random_ids(rng, rng.randint(*own_range)), rng.randint(*output_range))
            for i, t in enumerate(times)]


# ---------------------------------------------------------------------------------------------- client


@dataclass
class Result:
    sent: float = 0.0
    ttft: float | None = None
    finished: float = 0.0
    output_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    error: str | None = None


def gen_params(new_tokens: int) -> dict[str, Any]:
    return {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}


async def send(eng: Engine, req: Request, t0: float) -> Result:
    delay = t0 + req.arrival - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    res = Result(sent=time.perf_counter())
    last = None
    stream = await eng.async_generate(input_ids=req.input_ids, sampling_params=gen_params(req.new_tokens),
                                      stream=True)
    async for chunk in stream:
        ids = chunk["output_ids"]
        fr = chunk["meta_info"]["finish_reason"]
        if ids:
            now = time.perf_counter()
            if res.ttft is None:
                res.ttft = now - res.sent
            elif last is not None:
                res.itl.extend([(now - last) / len(ids)] * len(ids))
            last = now
            res.output_tokens += len(ids)
        if fr is not None:
            if fr.get("type") == "abort":
                res.error = fr.get("message") or "abort"
            break
    res.finished = time.perf_counter()
    return res


async def run_workload(eng: Engine, reqs: list[Request]) -> tuple[list[Result], float]:
    t0 = time.perf_counter() + 0.05
    results = await asyncio.gather(*[send(eng, r, t0) for r in reqs])
    return list(results), t0


def pct_ms(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)) * 1000, 2) if xs else None


def summarize(results: list[Result], reqs: list[Request]) -> dict[str, Any]:
    start = min(r.sent for r in results)
    span = max(r.finished for r in results) - start
    out_tok = sum(r.output_tokens for r in results)
    ttft = [r.ttft for r in results if r.ttft is not None]
    itl = [x for r in results for x in r.itl]
    return {
        "requests": len(results),
        "errors": sum(r.error is not None for r in results),
        "input_tokens": sum(len(q.input_ids) for q in reqs),
        "output_tokens": out_tok,
        "expected_output_tokens": sum(q.new_tokens for q in reqs),
        "arrival_span_s": round(reqs[-1].arrival - reqs[0].arrival, 3),
        "duration_s": round(span, 3),
        "output_tok_s": round(out_tok / span, 2),
        "req_s": round(len(results) / span, 3),
        "ttft_p50_ms": pct_ms(ttft, 50),
        "ttft_p99_ms": pct_ms(ttft, 99),
        "itl_p50_ms": pct_ms(itl, 50),
        "itl_p99_ms": pct_ms(itl, 99),
    }


# ---------------------------------------------------------------------------------------------- engine


def warm_up(eng: Engine, seed: int) -> None:
    """Exercise prefill of several lengths, batched decode and streaming, then empty the cache."""
    rng = random.Random(seed + 99)
    eng.generate(input_ids=[random_ids(rng, n) for n in (16, 200, 400, 700)], sampling_params=gen_params(8))

    async def streamed() -> None:
        it = await eng.async_generate(input_ids=random_ids(rng, 32), sampling_params=gen_params(4), stream=True)
        async for _ in it:
            pass

    asyncio.run(streamed())
    eng.flush_cache()


def run_config(name: str, workload: str, reqs: list[Request], engine_kwargs: dict[str, Any],
               extra: dict[str, Any], seed: int) -> dict[str, Any]:
    t = time.perf_counter()
    eng = Engine(**engine_kwargs)
    load_s = time.perf_counter() - t
    try:
        warm_up(eng, seed)
        before = eng.get_stats()
        results, _ = asyncio.run(run_workload(eng, reqs))
        after = eng.get_stats()
    finally:
        eng.shutdown()
        del eng
        gc.collect()
    computed = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    record = {"bench": "serving", "workload": workload, "config": name, "engine": engine_kwargs, **extra,
              **summarize(results, reqs),
              "computed_prompt_tokens": computed, "cached_prompt_tokens": cached,
              "cache_hit_rate": round(cached / (computed + cached), 4) if computed + cached else 0.0,
              "retractions": after["retractions"] - before["retractions"], "load_s": round(load_s, 2)}
    busy = after["worker_busy_seconds"] - before["worker_busy_seconds"]
    record["worker_busy_s"] = round(busy, 3)
    record["worker_busy_share"] = round(busy / record["duration_s"], 4)
    emit(record)
    return record


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    if a is None or b is None or not b["output_tok_s"]:
        return None
    return round(a["output_tok_s"] / b["output_tok_s"], 3)


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = build_parser()
    args = ap.parse_args()

    n_mixed = args.requests or (40 if args.quick else 200)
    n_prefix = args.prefix_requests or (24 if args.quick else 64)
    prefix_tokens = args.prefix_tokens or (300 if args.quick else 600)
    pool = args.prefix_max_total_tokens or round(4.25 * prefix_tokens)
    if n_prefix > 128:
        ap.error("--prefix-requests must be <= 128 (lpm falls back to fcfs order above 128 waiting requests)")
    base: dict[str, Any] = {} if args.threads is None else {"num_threads": args.threads}

    overlap = no_overlap = lpm = fcfs = None
    if not args.skip_overlap:
        reqs = mixed_workload(n_mixed, args.rate, args.seed, (20, 400), (8, 64))
        extra = {"rate": args.rate, "seed": args.seed}
        overlap = run_config("overlap", "mixed", reqs, {**base, "disable_overlap": False}, extra, args.seed)
        no_overlap = run_config("no_overlap", "mixed", reqs, {**base, "disable_overlap": True}, extra, args.seed)
    if not args.skip_prefix:
        reqs = shared_prefix_workload(n_prefix, args.prefix_groups, prefix_tokens, args.prefix_rate,
                                      args.seed, (20, 60), (8, 32))
        extra = {"rate": args.prefix_rate, "seed": args.seed, "groups": args.prefix_groups,
                 "prefix_tokens": prefix_tokens}
        kw = {**base, "max_total_tokens": pool}
        lpm = run_config("lpm", "shared_prefix", reqs, {**kw, "schedule_policy": "lpm"}, extra, args.seed)
        fcfs = run_config("fcfs", "shared_prefix", reqs, {**kw, "schedule_policy": "fcfs"}, extra, args.seed)

    overlap_x, lpm_x = ratio(overlap, no_overlap), ratio(lpm, fcfs)
    emit({
        "bench": "serving", "summary": True, "quick": args.quick,
        "overlap_vs_no_overlap_throughput": overlap_x, "overlap_target": 1.1,
        "overlap_target_met": None if overlap_x is None else overlap_x >= 1.1,
        "overlap_vs_no_overlap_req_s": None if overlap is None else round(overlap["req_s"] / no_overlap["req_s"], 3),
        # what overlap could give at most: the no-overlap run with every gap between forwards removed
        "overlap_upper_bound": None if no_overlap is None else
        round(no_overlap["duration_s"] / no_overlap["worker_busy_s"], 3),
        "lpm_vs_fcfs_throughput": lpm_x, "lpm_target": 1.3,
        "lpm_target_met": None if lpm_x is None else lpm_x >= 1.3,
        "lpm_vs_fcfs_ttft_p50": None if lpm is None or not lpm["ttft_p50_ms"] else
        round(fcfs["ttft_p50_ms"] / lpm["ttft_p50_ms"], 3),
    })


if __name__ == "__main__":
    main()
