"""Soak test of `radixgen serve` (not in the suite): mixed traffic with disconnects and bad input.

A real server runs in a subprocess (127.0.0.1). After a warm-up that fills the whole KV pool once (so
its pages are resident and later RSS growth is not the pool being touched), `--clients` concurrent
clients loop for `--duration` seconds (10 minutes by default) over a mix of
- good requests: chat (plain and streamed), completions, JSON-schema constrained chat (the output is
  validated with python-jsonschema), native /generate;
- disconnects: streams dropped after their first chunk, non-streamed requests given up after 0.3 s;
- bad input: lone surrogates, invalid UTF-8, malformed JSON, huge n / max_tokens, invalid schemas,
  too many stop strings, a 20 MB body, 20,000 random characters.
Good requests must all succeed (a 429 from the queue cap would count as a failure: none is expected
at this load), bad ones must all get a 4xx. RSS is sampled every 5 s; the report gives its start
(after warm-up), end, peak and least-squares slope (over the run, and over its second half: the first
minutes ramp up as caches and allocator arenas fill), the p50 / p99 latency of good non-streamed
requests, and whether the KV pool is back to idle at the end (a flush leaves 0 tokens used).
Prints one JSON line. Usage:
    python benchmarks/bench_soak.py [--duration 600] [--clients 16] [--model M] [--max-total-tokens 8192]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

# (no maxLength: XGrammar 0.2.9 lets a raw control character into a string bounded by maxLength)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
TOPICS = ["the sea", "a robot", "an old tree", "a lost key", "the moon", "a small cat", "a train", "a city"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def chat_body(rng: random.Random, **extra: object) -> dict:
    text = f"Tell me about {rng.choice(TOPICS)} in one line. ({rng.randrange(10**6)})"
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 16, "temperature": 0, **extra}


def bad_inputs(rng: random.Random) -> list[tuple[str, bytes]]:
    """(path, raw body) of requests that must get a 4xx."""
    msg = '{"messages":[{"role":"user","content":"%s"}]%s}'
    noise = "".join(chr(c) for c in rng.sample(range(0x20, 0xD7FF), 20_000) if chr(c) not in '"\\')
    return [
        ("/v1/chat/completions", (msg % ("a\\ud800", "")).encode()),
        ("/generate", b'{"text": "caf\xc3("}'),
        ("/v1/chat/completions", b'{"messages": [{"role": '),
        ("/v1/chat/completions", (msg % ("hi", ',"n":100000')).encode()),
        ("/v1/chat/completions", (msg % ("hi", ',"max_tokens":1000000000')).encode()),
        ("/v1/completions", b'{"prompt":"a","json_schema":{"type":"nope"}}'),
        ("/v1/completions", json.dumps({"prompt": "a", "stop": [str(i) for i in range(100)]}).encode()),
        ("/v1/completions", b'{"prompt":"' + b"a " * (10 * 1024 * 1024) + b'"}'),
        ("/v1/completions", json.dumps({"prompt": noise}).encode()),
        ("/v1/chat/completions", (msg % ("hi", ',"response_format":{"type":"json_schema","json_schema":{"name":"x",'
                                                 '"schema":' + '{"type":"array","items":' * 200 + "{}" + "}" * 200
                                           + "}}")).encode()),
    ]


class Soak:
    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.counts: dict[str, int] = {}
        self.good_failures: list[str] = []
        self.bad_not_4xx: list[str] = []
        self.latency: list[float] = []

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    async def client(self, http: httpx.AsyncClient, stop_at: float) -> None:
        rng = random.Random(self.rng.random())
        bad = bad_inputs(rng)
        while time.monotonic() < stop_at:
            r = rng.random()
            try:
                if r < 0.35:
                    await self.good(http, "/v1/chat/completions", chat_body(rng), "chat")
                elif r < 0.50:
                    await self.good_stream(http, chat_body(rng, stream=True))
                elif r < 0.60:
                    await self.good(http, "/v1/completions", {"prompt": f"Once upon a time {rng.randrange(10**6)}",
                                                              "max_tokens": 16, "temperature": 0}, "completions")
                elif r < 0.70:
                    await self.good(http, "/v1/chat/completions", chat_body(rng, response_format={
                        "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}), "json")
                elif r < 0.75:
                    await self.good(http, "/generate", {"text": f"Hello {rng.randrange(10**6)}",
                                                        "sampling_params": {"max_new_tokens": 16}}, "generate")
                elif r < 0.85:
                    await self.disconnect(http, rng)
                else:
                    await self.bad(http, *rng.choice(bad))
            except Exception as e:  # a transport error: a failure of the request's kind
                failed = self.bad_not_4xx if r >= 0.85 else self.good_failures
                failed.append(f"{type(e).__name__}: {e!r}")

    async def good(self, http: httpx.AsyncClient, path: str, body: dict, kind: str) -> None:
        import jsonschema

        t0 = time.perf_counter()
        resp = await http.post(path, json=body)
        self.latency.append(time.perf_counter() - t0)
        self.count(kind)
        if resp.status_code != 200:
            self.good_failures.append(f"{kind}: {resp.status_code} {resp.text[:200]}")
        elif kind == "json":
            text = resp.json()["choices"][0]["message"]["content"]
            try:
                if resp.json()["choices"][0]["finish_reason"] == "stop":
                    jsonschema.validate(json.loads(text), SCHEMA)
            except Exception as e:
                self.good_failures.append(f"json: {e!r} in {text!r}")

    async def good_stream(self, http: httpx.AsyncClient, body: dict) -> None:
        self.count("chat_stream")
        async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            events = [line async for line in resp.aiter_lines() if line.startswith("data: ")]
        if resp.status_code != 200 or not events or events[-1] != "data: [DONE]":
            self.good_failures.append(f"stream: {resp.status_code} {events[-2:]}")

    async def disconnect(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        self.count("disconnect")
        if rng.random() < 0.5:
            async with http.stream("POST", "/v1/chat/completions", json=chat_body(rng, stream=True, max_tokens=64)) \
                    as resp:
                async for _ in resp.aiter_lines():
                    break  # drop the stream after its first event
        else:
            try:
                await http.post("/v1/chat/completions", json=chat_body(rng, max_tokens=64), timeout=0.3)
            except httpx.TimeoutException:
                pass

    async def bad(self, http: httpx.AsyncClient, path: str, raw: bytes) -> None:
        self.count("bad_input")
        resp = await http.post(path, content=raw, headers={"content-type": "application/json"})
        if not 400 <= resp.status_code < 500:
            self.bad_not_4xx.append(f"{path}: {resp.status_code} {resp.text[:200]}")


async def sample_rss(pid: int, out: list[tuple[float, float]], stop_at: float, t0: float) -> None:
    while time.monotonic() < stop_at:
        out.append((time.monotonic() - t0, rss_mb(pid)))
        await asyncio.sleep(5)


async def fill_kv(http: httpx.AsyncClient, capacity: int) -> None:
    """Touch every page of the KV pool once: distinct long prompts until the pool has been full."""
    peak, k = 0, 0
    while peak < 0.9 * capacity:
        prompts = [f"Warm-up {k + i}: " + " ".join(f"word{(k + i) * 7 + j}" for j in range(300)) for i in range(8)]
        k += 8
        await asyncio.gather(*(http.post("/generate", json={"text": p, "sampling_params": {"max_new_tokens": 4}})
                               for p in prompts))
        peak = max(peak, (await http.get("/stats")).json()["kv_used"])


async def main_async(args: argparse.Namespace, url: str, pid: int) -> dict:
    limits = httpx.Limits(max_connections=args.clients * 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await fill_kv(http, args.max_total_tokens)
        soak = Soak(url, seed=0)
        t0 = time.monotonic()
        stop_at = t0 + args.duration
        samples: list[tuple[float, float]] = []
        await asyncio.gather(sample_rss(pid, samples, stop_at, t0),
                             *(soak.client(http, stop_at) for _ in range(args.clients)))
        await asyncio.sleep(3)  # streams closing, the heap trimmed
        samples.append((time.monotonic() - t0, rss_mb(pid)))
        idle = False
        for _ in range(100):
            if (await http.post("/flush_cache")).json()["success"]:
                idle = (await http.get("/stats")).json()["kv_used"] == 0
                break
            await asyncio.sleep(0.2)
    ts, rs = [t for t, _ in samples], [r for _, r in samples]
    slope = statistics.linear_regression(ts, rs).slope * 60 if len(samples) > 2 else 0.0
    half = len(samples) // 2  # the second half: after the first minutes' ramp (caches and arenas filling)
    late = statistics.linear_regression(ts[half:], rs[half:]).slope * 60 if len(samples) - half > 2 else 0.0
    lat = sorted(soak.latency)
    return {
        "duration_s": args.duration, "clients": args.clients, "requests": soak.counts,
        "good_failures": len(soak.good_failures), "bad_input_not_4xx": len(soak.bad_not_4xx),
        "latency_p50_s": round(lat[len(lat) // 2], 3) if lat else None,
        "latency_p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3) if lat else None,
        "rss_start_mb": round(rs[0], 1), "rss_end_mb": round(rs[-1], 1), "rss_peak_mb": round(max(rs), 1),
        "rss_slope_mb_per_min": round(slope, 2),
        "rss_slope_second_half_mb_per_min": round(late, 2), "kv_idle_after": idle,
        "rss_every_30s_mb": [round(r) for t, r in samples if t % 30 < 5] + [round(rs[-1])],
        "examples": (soak.good_failures + soak.bad_not_4xx)[:5],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-total-tokens", type=int, default=8192)
    args = ap.parse_args()
    port = free_port()
    cmd = [sys.executable, "-m", "radixgen.runtime.cli", "serve", "--port", str(port), "--num-threads", "1",
           "--max-total-tokens", str(args.max_total_tokens), *(["--model", args.model] if args.model else [])]
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        print(json.dumps({"bench": "soak", **asyncio.run(main_async(args, url, proc.pid))}), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.seek(0)
        err = log.read()
        tracebacks = err.count("Traceback")
        if tracebacks:
            print(json.dumps({"server_tracebacks": tracebacks, "last": err[-2000:]}), flush=True)


if __name__ == "__main__":
    main()
