"""Memory of a loaded GGUF model against its file: RSS after load and peak RSS while loading, each over
the bound 1.3 x file + KV pool + 0.4 GB (a ratio <= 1 meets it), and no float32 copy on disk.

Each model loads in a fresh subprocess (an Engine with a fixed KV pool, then 8 greedy tokens), which
reports /proc/self/status's VmRSS and VmHWM, the KV pool's bytes and the time to its first token. The
models: the default SmolLM2-135M and any synthetic GGUFs given (benchmarks/synth_gguf.py writes them:
random weights at Llama 1B / 3B / 8B shapes, where the weights do not fit in the CPU's cache).

    python benchmarks/bench_memory.py [--gguf /tmp/synth-1b-q4_0.gguf ...] [--kv-tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SLACK = 0.4e9  # bytes the bound allows beyond the weights and KV (interpreter, torch, tokenizer)
FACTOR = 1.3


def status_bytes(field: str) -> int:
    """A /proc/self/status memory field (kB) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def cache_bytes() -> int:
    """Bytes under radixgen's user cache other than the kernels' builds (a weights copy would be there)."""
    root = Path(os.environ.get("RADIXGEN_CACHE", Path.home() / ".cache" / "radixgen"))
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and "kernels" not in p.parts)


def measure(model: str, kv_tokens: int) -> dict:
    """Load `model` in this process and measure (the subprocess side)."""
    t0 = time.perf_counter()
    from radixgen.runtime.engine import Engine

    imported = status_bytes("VmRSS")
    cache_before = cache_bytes()
    engine = Engine(model=model, max_total_tokens=kv_tokens, max_running_requests=4)
    loaded = time.perf_counter()
    rss, peak = status_bytes("VmRSS"), status_bytes("VmHWM")
    out = engine.generate(input_ids=[1, 2, 3, 4, 5, 6, 7, 8], sampling_params={
        "max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
    first = time.perf_counter()
    pool = engine.runner.token_to_kv_pool
    kv = sum(t.numel() * t.element_size() for t in (*pool.k_buffer, *pool.v_buffer))
    engine.shutdown()
    return {"rss_after_imports": imported, "rss_after_load": rss, "peak_rss_load": peak, "kv_pool_bytes": kv,
            "load_s": loaded - t0, "first_tokens_s": first - t0, "tokens": len(out["output_ids"]),
            "cache_written_bytes": cache_bytes() - cache_before}


def run(model: str, kv_tokens: int) -> dict:
    """`measure` in a fresh interpreter, with the ratios against the bound."""
    proc = subprocess.run([sys.executable, __file__, "--child", model, "--kv-tokens", str(kv_tokens)],
                          capture_output=True, text=True, check=True)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    from radixgen.runtime.models.resolve import resolve_model_path

    file = resolve_model_path(None if model == "default" else model).stat().st_size
    bound = FACTOR * file + r["kv_pool_bytes"] + SLACK
    return {"model": Path(model).name, "file_gb": round(file / 1e9, 3), "kv_gb": round(r["kv_pool_bytes"] / 1e9, 3),
            "rss_gb": round(r["rss_after_load"] / 1e9, 3), "peak_gb": round(r["peak_rss_load"] / 1e9, 3),
            "imports_gb": round(r["rss_after_imports"] / 1e9, 3), "bound_gb": round(bound / 1e9, 3),
            "rss_over_bound": round(r["rss_after_load"] / bound, 3),
            "peak_over_bound": round(r["peak_rss_load"] / bound, 3),
            "rss_over_file": round((r["rss_after_load"] - r["rss_after_imports"] - r["kv_pool_bytes"]) / file, 3),
            "load_s": round(r["load_s"], 1), "first_tokens_s": round(r["first_tokens_s"], 1),
            "decoded_tokens": r["tokens"], "cache_written_bytes": r["cache_written_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", nargs="*", default=[], help="synthetic (or any) GGUF files to measure too")
    parser.add_argument("--kv-tokens", type=int, default=4096, help="KV pool size in tokens (fixed, for the bound)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(None if args.child == "default" else args.child, args.kv_tokens)))
        return
    for model in ["default", *args.gguf]:
        print(json.dumps(run(model, args.kv_tokens)), flush=True)


if __name__ == "__main__":
    main()
