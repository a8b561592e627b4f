"""Ours against llama.cpp on the same GGUF files, 2 threads: prefill of 256 tokens and batch-1 decode of
128, with the ratios the quantized-weights issue asks for (decode >= 1.2x, prefill >= 3x).

llama.cpp runs as its own `llama-bench` (pp256 and tg128, best settings of its build), built with cmake
from the llama.cpp that the llama-cpp-python source distribution vendors (on CPUs where its AMX path
dies with SIGILL, with -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF); give its path with
--llama-bench or LLAMA_BENCH. Ours: an Engine on the file (radix cache off), prefill = 256 prompt tokens
and one output token (the mean rate of 3, as llama-bench's of its 3 repetitions), decode = 128 greedy
tokens after a 16-token prompt (its prefill included). The sides
alternate for --rounds rounds (a shared VM drifts by 20-30% over minutes); ratios use the means.
benchmarks/synth_gguf.py writes the synthetic 1B / 3B / 8B files this is meant for.

Beside each ratio, the most this machine allows ours (measured in the same run): decode reads every
weight once a token, so it is at most one token per pass of one row through the engine's own block
matrices (timed in the engine: `matrices_b1`); prefill multiplies 2 x params flops a token, at most at
the rate of a large bfloat16 GEMM (oneDNN; the wide steps' GEMMs with --wide-matmul-dtype bfloat16 where
the CPU has no AMX). The int16 and int8 settings (auto is int16 where the CPU has int8 dot products and no
AMX) run on those dot products instead, whose peak this does not measure, so for them the printed
prefill ceiling is the bfloat16 path's bound, not theirs (Zen 4's int8 block GEMMs multiply faster than
its bfloat16 GEMM). The memory read bandwidth (a torch sum of 1 GiB) is printed for reference.

--as-isa runs ours as on a CPU with less than this one (AS_ISA: our kernels built for that instruction
set, the CPU flags the engine's choices read narrowed to it, torch's GEMMs limited to it), so one VM can
measure the paths of others; give it a llama-bench built for the same set (for avx2:
-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
-DGGML_AVX512=OFF; for avx512-no-amx: the AMX-off build above). Each core's instruction rates still
are this CPU's, not the other model's: a Sapphire Rapids core runs vdpbf16ps at a quarter of vpdpbusd's
multiply-adds, a Zen 4 core at half.

    python benchmarks/bench_gguf.py /tmp/synth-1b-q4_k_m.gguf ... [--rounds 2] [--llama-bench PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BARS = {"decode_b1": 1.2, "prefill_256": 3.0}


# --as-isa: our kernels' compiler flags, the CPU flags kept (all but those with these prefixes), and the
# environment that limits torch's own kernels (MKL, oneDNN, ATen) to the same instructions
AS_ISA = {
    "avx2": (["-O3", "-march=haswell"], ("avx512", "amx", "avx_vnni"),
             {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}),
    "avx512-no-amx": (["-O3", "-march=icelake-server", "-mavx512bf16"], ("amx",),  # AMD Zen 4's set
                      {"MKL_ENABLE_INSTRUCTIONS": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                       "ATEN_CPU_CAPABILITY": "avx512"}),
}


def narrow_to(isa: str) -> None:
    """Make this process's engine run as on a CPU with instruction set `isa` only (AS_ISA); call before
    torch and the engine are imported."""
    flags, hidden, env = AS_ISA[isa]
    os.environ.update(env)
    from radixgen.runtime.kernels import build

    build.VARIANT_FLAGS["native"] = flags
    have = build.cpu_flags()
    build.cpu_flags = lambda: {f for f in have if not f.startswith(hidden)}
    if build.build() is None:  # else the engine would quietly run its torch fallbacks
        raise SystemExit(f"--as-isa {isa}: the C kernels do not build with {' '.join(flags)} here")


PREFILL_REPS = 3  # timed 256-token prefills a round, as many as llama-bench's -r 3 below


def ours(path: str, new_tokens: int, wide: str = "auto") -> dict:
    """Prefill-256 and batch-1 decode tokens/s of an Engine on `path` with `wide_matmul_dtype=wide`
    (torch imported here)."""
    from radixgen.runtime.engine import Engine

    eng = Engine(model=path, disable_radix_cache=True, max_total_tokens=4096, max_running_requests=4,
                 wide_matmul_dtype=wide)
    try:
        vocab = eng.model_config.vocab_size
        ids = [(i * 7919 + 13) % (vocab - 10) + 5 for i in range(256)]
        eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})  # warm-up
        rates = []
        for _ in range(PREFILL_REPS):  # as llama-bench's avg_ts: the mean of its repetitions' rates
            t = time.perf_counter()
            eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
            rates.append(256 / (time.perf_counter() - t))
        prefill = statistics.mean(rates)
        greedy = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
        eng.generate(input_ids=ids[:16], sampling_params={**greedy, "max_new_tokens": 8})  # warm-up
        t = time.perf_counter()
        eng.generate(input_ids=ids[:16], sampling_params=greedy)
        decode = new_tokens / (time.perf_counter() - t)
        return {"prefill_256": prefill, "decode_b1": decode, "matrices_b1": 1 / matrices_seconds(eng)}
    finally:
        eng.shutdown()


def matrices_seconds(eng, reps: int = 5) -> float:
    """Seconds the engine's block matrices (every layer's and the head) take for one row, best of `reps`:
    a decode step is never shorter, so 1 / this is the most tokens/s batch-1 decode could reach."""
    import torch

    from radixgen.runtime.kernels.block_gemm import block_linear
    from radixgen.runtime.layers.linear import BlockLinear
    from radixgen.runtime.threads import on_short_lived_thread

    panels = [m.panels for m in eng.runner.model.modules() if isinstance(m, BlockLinear)]

    def timed() -> float:
        xs = [torch.randn(1, p.shape[1]) for p in panels]
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            for x, p in zip(xs, panels, strict=True):
                block_linear(x, p)
            best = min(best, time.perf_counter() - t)
        return best

    return on_short_lived_thread(timed)


def llama_cpp(binary: str, path: str, new_tokens: int) -> dict:
    """llama-bench's pp256 and tg`new_tokens` tokens/s on 2 threads (mean of its 3 repetitions)."""
    out = subprocess.run([binary, "-m", path, "-t", "2", "-p", "256", "-n", str(new_tokens), "-r", "3", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    pick = lambda key: next(r["avg_ts"] for r in rows if r[key] > 0)
    return {"prefill_256": pick("n_prompt"), "decode_b1": pick("n_gen")}


def bf16_gemm_gflops() -> float:
    """GFLOP/s of a [256, 4096] x [4096, 4096] bfloat16 GEMM (best of 3): the wide steps' GEMM rate."""
    import torch

    a, b = torch.randn(256, 4096).bfloat16(), torch.randn(4096, 4096).bfloat16()
    torch.nn.functional.linear(a, b)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        torch.nn.functional.linear(a, b)
        best = max(best, 2 * 256 * 4096 * 4096 / (time.perf_counter() - t) / 1e9)
    return best


def model_params(path: str) -> int:
    """The parameters a prompt token is multiplied by in the GGUF `path`: every matrix but the embedding
    table and the head (a prefill computes one row of logits; Gemma 3 270M's 262k-row table is 60% of it)."""
    from radixgen.runtime.models.gguf_file import read_header

    return sum(t.n_elements for t in read_header(Path(path)).tensors
               if t.name.startswith("blk.") and len(t.shape) >= 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="+", help="GGUF files (e.g. from benchmarks/synth_gguf.py)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH") or shutil.which("llama-bench"))
    ap.add_argument("--wide-matmul-dtype", default="auto", choices=["auto", "float32", "bfloat16", "int16", "int8"],
                    help="our prompt chunks' matrices (EngineConfig.wide_matmul_dtype; int8 is llama.cpp's precision)")
    ap.add_argument("--as-isa", choices=sorted(AS_ISA), help="ours as on a CPU with only this instruction set")
    args = ap.parse_args()
    if args.as_isa:
        narrow_to(args.as_isa)
    if args.llama_bench is None:
        print("note: no llama-bench (give --llama-bench or LLAMA_BENCH): ours only")
    import torch

    torch.set_num_threads(2)
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_decode import read_bandwidth_gbs  # the same measurement as bench_decode's summary

    bandwidth, gflops = read_bandwidth_gbs(), bf16_gemm_gflops()
    print(json.dumps({"read_bandwidth_gbs": round(bandwidth, 1), "bf16_gemm_gflops": round(gflops, 1),
                      "as_isa": args.as_isa or "native"}), flush=True)
    for path in args.gguf:
        runs: dict[str, list[dict]] = {"ours": [], "llama.cpp": []}
        for _ in range(args.rounds):
            runs["ours"].append(ours(path, args.new_tokens, args.wide_matmul_dtype))
            if args.llama_bench:
                runs["llama.cpp"].append(llama_cpp(args.llama_bench, path, args.new_tokens))
        mean = {side: {k: statistics.mean(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items() if rs}
        line = {"model": Path(path).name, "size_gb": round(Path(path).stat().st_size / 1e9, 3),
                **{f"{side}_{k}_tok_s": round(v, 1) for side, m in mean.items() for k, v in m.items()}}
        params = model_params(path)
        most = {"decode_b1": mean["ours"]["matrices_b1"], "prefill_256": gflops * 1e9 / (2 * params)}
        if "llama.cpp" in mean:
            for k, bar in BARS.items():  # ratio, the bar, and the most this machine allows ours
                line[f"{k}_ratio"] = round(mean["ours"][k] / mean["llama.cpp"][k], 2)
                line[f"{k}_bar"] = bar
                line[f"{k}_ceiling"] = round(most[k] / mean["llama.cpp"][k], 2)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
