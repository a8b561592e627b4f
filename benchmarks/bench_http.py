"""HTTP serving overhead: the real `radixgen serve` against the in-process engine, and streamed against
non-streamed chat completions with tools on and off, in one run.

The default model serves N concurrent requests per mode (distinct prompts, greedy), driven by the
official async openai client over 127.0.0.1:

- in_process: `Engine.async_generate(stream=True)` in this process (exactly M new tokens, ignore_eos)
- completions_stream: the same through the server's streaming /v1/completions
- chat / chat_stream: /v1/chat/completions without tools (M new tokens, ignore_eos), whole or streamed
- chat_tools / chat_tools_stream: with a tool and tool_choice "required": each reply is one grammar-
  forced tool call (its length set by the model, the same in both modes), whole or streamed as
  argument fragments

Each round runs the pairs completions_stream / in_process, chat_stream / chat and chat_tools_stream /
chat_tools, the two of a pair back to back (in alternating order), so that background load on a shared
machine hits both alike; a pair's ratio is taken per round and the summary reports its median over
the rounds (targets: completions_stream / in_process >= 0.85, chat_tools_stream / chat_tools >= 0.95:
streaming tool calls costs little), with each mode's best round. Between two server modes it also
reports the server process's CPU time per request, baseline / measured (Linux): with
`--server-threads 1` that figure is free of OpenMP spinning and holds better than wall time on a loaded
machine. TTFT is the time to the first streamed delta. Prints one JSON line per round and mode, then
the summary line.
Usage: python benchmarks/bench_http.py [--requests 16] [--new-tokens 24] [--rounds 9] [--server-threads N]
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Perth", "Dakar"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--server-threads", type=int, default=None,
                    help="torch threads of the server and of the in-process engine (default: torch's choice); 1 "
                         "keeps the server's CPU time free of OpenMP spinning, so its ratios hold on a loaded machine")
    return ap


def prompts(n: int) -> list[str]:
    topics = ["the sea", "a robot", "a city at night", "an old tree", "a lost key", "the moon", "a small cat",
              "a long train"]
    return [f"Request {i}: write a short story about {topics[i % len(topics)]} and number {i}." for i in range(n)]


def weather_questions(n: int) -> list[str]:
    return [f"Request {i}: what is the weather like in {CITIES[i % len(CITIES)]} today?" for i in range(n)]


def summarize(mode: str, ttfts: list[float], wall: float, n: int, tokens: int) -> dict:
    out = {"mode": mode, "requests": n, "completion_tokens": tokens, "wall_s": round(wall, 3),
           "req_per_s": round(n / wall, 3), "tok_per_s": round(tokens / wall, 1)}
    if ttfts:
        ttfts = sorted(ttfts)
        out["ttft_p50_s"] = round(statistics.median(ttfts), 4)
        out["ttft_p99_s"] = round(ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))], 4)
    return out


# One request of a mode: returns (TTFT or None, completion tokens).
Request = Callable[[int], Awaitable[tuple[float | None, int]]]


def engine_mode(engine, texts: list[str], new_tokens: int) -> Request:
    sp = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}

    async def one(i: int) -> tuple[float | None, int]:
        t0, ttft, tokens = time.perf_counter(), None, 0
        async for chunk in await engine.async_generate(texts[i], sp, stream=True):
            if ttft is None and chunk["text"]:
                ttft = time.perf_counter() - t0
            tokens += len(chunk["output_ids"])
        return ttft, tokens

    return one


def http_modes(client, texts: list[str], questions: list[str], new_tokens: int) -> dict[str, Request]:
    """The server's modes (see the module docstring)."""
    plain = dict(model="default", max_tokens=new_tokens, temperature=0, extra_body={"ignore_eos": True})
    tools = dict(model="default", max_tokens=64, temperature=0, tools=[WEATHER], tool_choice="required",
                 parallel_tool_calls=False)
    usage = {"stream_options": {"include_usage": True}}

    async def completions_stream(i: int) -> tuple[float | None, int]:
        t0, ttft, tokens = time.perf_counter(), None, 0
        async for chunk in await client.completions.create(prompt=texts[i], stream=True, **plain, **usage):
            if ttft is None and chunk.choices and chunk.choices[0].text:
                ttft = time.perf_counter() - t0
            tokens = chunk.usage.completion_tokens if chunk.usage else tokens
        return ttft, tokens

    def chat(kw: dict, text_of: list[str], stream: bool) -> Request:
        async def one(i: int) -> tuple[float | None, int]:
            msgs = [{"role": "user", "content": text_of[i]}]
            if not stream:
                out = await client.chat.completions.create(messages=msgs, **kw)
                assert kw is plain or out.choices[0].finish_reason == "tool_calls"
                return None, out.usage.completion_tokens
            t0, ttft, tokens, finish = time.perf_counter(), None, 0, None
            async for chunk in await client.chat.completions.create(messages=msgs, stream=True, **kw, **usage):
                if chunk.choices:
                    d = chunk.choices[0].delta
                    if ttft is None and (d.content or d.tool_calls):
                        ttft = time.perf_counter() - t0
                    finish = chunk.choices[0].finish_reason or finish
                tokens = chunk.usage.completion_tokens if chunk.usage else tokens
            assert kw is plain or finish == "tool_calls"
            return ttft, tokens

        return one

    return {"completions_stream": completions_stream,
            "chat": chat(plain, texts, False), "chat_stream": chat(plain, texts, True),
            "chat_tools": chat(tools, questions, False), "chat_tools_stream": chat(tools, questions, True)}


async def run_mode(one: Request, n: int) -> tuple[list[float], float, int]:
    t = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t
    return [r[0] for r in results if r[0] is not None], wall, sum(r[1] for r in results)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, threads: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "radixgen.runtime.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if threads is not None:
        cmd += ["--num-threads", str(threads)]
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


# (measured, baseline): the two run back to back each round, in alternating order
PAIRS = (("completions_stream", "in_process"), ("chat_stream", "chat"), ("chat_tools_stream", "chat_tools"))


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, all threads) a process has used so far; None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Results:
    best: dict[str, dict] = field(default_factory=dict)  # mode -> its best round
    rate: dict[str, list[float]] = field(default_factory=dict)  # pair -> req/s ratio per round
    cpu: dict[str, list[float]] = field(default_factory=dict)  # pair -> server CPU ratio per round

    def summary(self) -> dict:
        def median(xs: dict[str, list[float]]) -> dict[str, float]:
            return {k: round(statistics.median(v), 3) for k, v in xs.items() if v}

        return {"req_per_s_best": {m: r["req_per_s"] for m, r in self.best.items()},
                "ttft_p50_s_best": {m: r["ttft_p50_s"] for m, r in self.best.items() if "ttft_p50_s" in r},
                "rate_ratio_per_round": {k: [round(x, 3) for x in v] for k, v in self.rate.items()},
                "rate_ratio_median": median(self.rate), "server_cpu_ratio_median": median(self.cpu)}


async def bench(url: str, server_pid: int, engine, args: argparse.Namespace) -> Results:
    """Each pair's req/s ratio per round (and, between two server modes, the ratio of the server CPU
    time per request, baseline / measured), and each mode's best round."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    texts, questions = prompts(args.requests), weather_questions(args.requests)
    modes = {"in_process": engine_mode(engine, texts, args.new_tokens),
             **http_modes(client, texts, questions, args.new_tokens)}
    warm = {"in_process": engine_mode(engine, [f"Warm-up {t}" for t in texts], 2),
            **http_modes(client, [f"Warm-up {t}" for t in texts], [f"Warm-up: {q}" for q in questions], 2)}
    for one in warm.values():  # every mode once at the full batch size, unmeasured (grammar compiled)
        await run_mode(one, args.requests)
    out = Results()
    for r in range(args.rounds):
        for pair in PAIRS:
            rate, cpu = {}, {}
            for mode in (pair if r % 2 == 0 else pair[::-1]):
                cpu0 = cpu_seconds(server_pid)
                ttfts, wall, tokens = await run_mode(modes[mode], args.requests)
                cpu1 = cpu_seconds(server_pid)
                if mode == "in_process":
                    engine.flush_cache()
                else:
                    urllib.request.urlopen(urllib.request.Request(url + "/flush_cache", data=b"{}", method="POST"))
                res = dict(summarize(mode, ttfts, wall, args.requests, tokens), round=r)
                if mode != "in_process" and cpu0 is not None and cpu1 is not None:
                    res["server_cpu_s"] = cpu[mode] = round(cpu1 - cpu0, 3)
                print(json.dumps(res), flush=True)
                rate[mode] = res["req_per_s"]
                if mode not in out.best or res["req_per_s"] > out.best[mode]["req_per_s"]:
                    out.best[mode] = res
            key = f"{pair[0]}/{pair[1]}"
            out.rate.setdefault(key, []).append(rate[pair[0]] / rate[pair[1]])
            if len(cpu) == 2:
                out.cpu.setdefault(key, []).append(cpu[pair[1]] / cpu[pair[0]])
    await client.close()
    return out


def main() -> None:
    args = build_parser().parse_args()

    from radixgen.runtime.engine import Engine

    port = free_port()
    proc = start_server(port, args.server_threads)
    engine = Engine(num_threads=args.server_threads)  # in_process runs with the server's threads
    try:
        results = asyncio.run(bench(f"http://127.0.0.1:{port}", proc.pid, engine, args))
    finally:
        engine.shutdown()
        proc.terminate()
        proc.wait(timeout=30)
    summary = results.summary()
    rates = summary["rate_ratio_median"]
    http, tools = rates["completions_stream/in_process"], rates["chat_tools_stream/chat_tools"]
    print(json.dumps({"bench": "http", "requests": args.requests, "new_tokens": args.new_tokens,
                      "server_threads": args.server_threads, **summary,
                      "targets": {"completions_stream/in_process": 0.85, "chat_tools_stream/chat_tools": 0.95},
                      "meets_targets": http >= 0.85 and tools >= 0.95}))


if __name__ == "__main__":
    main()
