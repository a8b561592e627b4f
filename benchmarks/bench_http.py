"""HTTP serving overhead: requests/s and TTFT through `radixgen serve` vs the in-process engine.

The same workload runs twice on the default model: N concurrent streaming requests (distinct
prompts, greedy, exactly M new tokens with ignore_eos), first through `Engine.async_generate(stream=True)`
in this process, and through the real server in a subprocess (127.0.0.1) with the official async
openai client streaming /v1/completions. TTFT is the time until the first chunk carrying text.
Both stay loaded (the idle one sleeps) and the modes alternate for `--rounds` rounds (ABBA order),
so background load on a shared machine hits both alike; each mode reports its best round.
Prints one JSON line per round and mode and a summary line with the ratios HTTP / in-process
(target: throughput ratio >= 0.85).
Usage: python benchmarks/bench_http.py [--requests 64] [--new-tokens 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    return ap


def prompts(n: int) -> list[str]:
    topics = ["the sea", "a robot", "a city at night", "an old tree", "a lost key", "the moon", "a small cat",
              "a long train"]
    return [f"Request {i}: write a short story about {topics[i % len(topics)]} and number {i}." for i in range(n)]


def summarize(mode: str, ttfts: list[float], wall: float, n: int, new_tokens: int) -> dict:
    ttfts = sorted(ttfts)
    p99 = ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))]
    return {"mode": mode, "requests": n, "new_tokens": new_tokens, "wall_s": round(wall, 3),
            "req_per_s": round(n / wall, 3), "tok_per_s": round(n * new_tokens / wall, 1),
            "ttft_p50_s": round(statistics.median(ttfts), 4), "ttft_p99_s": round(p99, 4)}


async def run_engine(engine, texts: list[str], new_tokens: int) -> tuple[list[float], float]:
    sp = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}

    async def one(text: str) -> float:
        t0 = time.perf_counter()
        ttft = None
        async for chunk in await engine.async_generate(text, sp, stream=True):
            if ttft is None and chunk["text"]:
                ttft = time.perf_counter() - t0
        return ttft if ttft is not None else time.perf_counter() - t0

    t = time.perf_counter()
    ttfts = await asyncio.gather(*(one(x) for x in texts))
    return list(ttfts), time.perf_counter() - t


async def run_http(base_url: str, texts: list[str], new_tokens: int) -> tuple[list[float], float]:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600)

    async def one(text: str) -> float:
        t0 = time.perf_counter()
        ttft = None
        stream = await client.completions.create(model="default", prompt=text, max_tokens=new_tokens, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].text:
                ttft = time.perf_counter() - t0
        return ttft if ttft is not None else time.perf_counter() - t0

    t = time.perf_counter()
    ttfts = await asyncio.gather(*(one(x) for x in texts))
    wall = time.perf_counter() - t
    await client.close()
    return list(ttfts), wall


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "radixgen.runtime.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise TimeoutError("server did not become healthy")


def main() -> None:
    args = build_parser().parse_args()
    texts = prompts(args.requests)
    warm = [f"Warm-up {i}: say something about {t}." for i, t in enumerate(prompts(args.requests))]

    from radixgen.runtime.engine import Engine

    port = free_port()
    proc = start_server(port)
    url = f"http://127.0.0.1:{port}"
    engine = Engine()
    best: dict[str, dict] = {}
    try:
        asyncio.run(run_engine(engine, warm, 2))  # warm both at the full batch size (unmeasured)
        asyncio.run(run_http(url, warm, 2))
        for r in range(args.rounds):
            order = ("in_process", "http") if r % 2 == 0 else ("http", "in_process")
            for mode in order:
                if mode == "http":
                    ttfts, wall = asyncio.run(run_http(url, texts, args.new_tokens))
                    urllib.request.urlopen(urllib.request.Request(url + "/flush_cache", data=b"{}", method="POST"))
                else:
                    ttfts, wall = asyncio.run(run_engine(engine, texts, args.new_tokens))
                    engine.flush_cache()
                res = dict(summarize(mode, ttfts, wall, args.requests, args.new_tokens), round=r)
                print(json.dumps(res), flush=True)
                if mode not in best or res["req_per_s"] > best[mode]["req_per_s"]:
                    best[mode] = res
    finally:
        engine.shutdown()
        proc.terminate()
        proc.wait(timeout=30)
    local, http = best["in_process"], best["http"]
    ratio = http["req_per_s"] / local["req_per_s"]
    print(json.dumps({"bench": "http", "requests": args.requests, "new_tokens": args.new_tokens,
                      "in_process_req_per_s": local["req_per_s"], "http_req_per_s": http["req_per_s"],
                      "throughput_ratio": round(ratio, 3),
                      "ttft_p50_s": [local["ttft_p50_s"], http["ttft_p50_s"]],
                      "ttft_p99_s": [local["ttft_p99_s"], http["ttft_p99_s"]],
                      "ttft_p50_ratio": round(http["ttft_p50_s"] / local["ttft_p50_s"], 3),
                      "ttft_p99_ratio": round(http["ttft_p99_s"] / local["ttft_p99_s"], 3),
                      "target": 0.85, "meets_target": ratio >= 0.85}))


if __name__ == "__main__":
    main()
