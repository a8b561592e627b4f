"""Decode / prefill throughput across the envelope in one run: our engine against llama.cpp (same
GGUF, same prompts) and HF transformers (same weights).

Per round (ours on the default config: float32, GGUF blocks):
- prefill tokens/s of a 256-token prompt;
- batch-1 decode of 128 tokens, non-streamed and streamed, alternated three times each, medians
  (streamed / non-streamed: the streaming cost; one run of each differed by up to ~8% either way);
- aggregate decode tokens/s of 16 and 64 requests decoding together (each after an untimed run of the
  same shape: a fresh engine's first writes to its KV pool fault, see "First touch");
- batch-1 decode-only tokens/s (after the first token) at 256 and 8,000 tokens of context with a
  16-bit KV cache (`--kv-cache-dtype`, default float16): how far long contexts fall behind;
- llama.cpp (when llama-cpp-python is installed): prefill 256 and batch-1 decode 128, 2 threads;
- HF transformers float32: prefill, batch-1 and batch-16 decode (the project's first baseline);
- HF-first-in-process: batch-1 decode in a fresh process against one whose main thread ran HF
  transformers first (an idle OpenMP team of the user's own torch work), two subprocesses.
The machine's speed drifts by 20-30% over minutes (a shared VM), so the sides alternate for `--rounds`
rounds and ratios use the means; each side runs with no idle OpenMP team of the other's in the
process (ours: a fresh engine per case, shut down after; the peers: on short-lived threads).
The summary prints each ratio the performance issue asks for next to its bar, and the load average;
also this machine's memory read bandwidth and the long-context ratio it allows at most (the extra
K/V bytes read at that bandwidth on top of the 256-token step), and the batch-64 over batch-16 ratio
the matrices allow at most (a batch-64 step is never shorter than the engine's own weight matrices
take for 64 rows, timed in the same engine right after its batch runs).

--scale: ours only, aggregate decode at batch 1/4/16/64/128 and batch-1 decode at 256/2k/8k context.
Usage: python benchmarks/bench_decode.py [--rounds 2] [--new-tokens 128] [--scale] [--no-hf]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every side; ratios use the means")
    ap.add_argument("--kv-cache-dtype", default="float16", help="KV dtype of the context cases")
    ap.add_argument("--scale", action="store_true", help="ours only: batch 1..128 and context 256..8k")
    ap.add_argument("--no-hf", action="store_true", help="skip the HF transformers column")
    ap.add_argument("--probe", choices=["clean", "hf-first"], help=argparse.SUPPRESS)
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and bad flags answer before torch is imported

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import llama_cpp_peer  # noqa: E402

# First touch: A fresh engine's KV pool is untouched memory: the first write to each page faults. On a VM
# whose host backs guest memory lazily that costs far more than the page's zeroing (this 2-core VM:
# ~0.2 GiB/s for never-touched pages against ~8 GiB/s for pages touched before), and batch 64's first
# run writes ~400 MB of new KV (104 -> 130 ms a step). A serving engine pays that once in its life, so
# each batch size runs once untimed first (the slots a run frees are the next run's).
LONG = 8000  # tokens of context of the long-context case (SmolLM2's limit is 8,192)


def prompt_ids(tok, n: int, salt: int = 0) -> list[int]:
    text = " ".join(f"word{(i * 7 + salt) % 97}" for i in range(n * 2 + 16))
    ids = tok.encode(text, add_special_tokens=False)
    while len(ids) < n:  # long prompts: repeat the text
        ids += ids
    return ids[:n]


def greedy(new_tokens: int) -> dict:
    return {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}


def decode_rate(eng, ids: list[int], new_tokens: int) -> float:
    """Batch-1 decode tokens/s after the first streamed chunk (prefill and first token excluded)."""
    stamps = []  # (time, tokens so far) per chunk
    for chunk in eng.generate(input_ids=ids, sampling_params=greedy(new_tokens), stream=True):
        if chunk["output_ids"]:
            stamps.append((time.perf_counter(), len(chunk["output_ids"]) + (stamps[-1][1] if stamps else 0)))
    (t0, n0), (t1, n1) = stamps[0], stamps[-1]
    return (n1 - n0) / (t1 - t0)


STREAM_PAIRS = 3  # batch-1 decodes non-streamed and streamed, alternated; each side reports its median


def ours_main(tok, new_tokens: int) -> dict:
    from radixgen.runtime.engine import Engine

    eng = Engine(disable_radix_cache=True)
    try:
        ids = prompt_ids(tok, 256)
        eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})  # warm-up
        t = time.perf_counter()
        eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
        out = {"prefill_tok_s": 256 / (time.perf_counter() - t)}
        short = prompt_ids(tok, 16)
        plain, streamed = [], []
        for _ in range(STREAM_PAIRS):  # alternated: one run of each is within the VM's drift
            t = time.perf_counter()
            eng.generate(input_ids=short, sampling_params=greedy(new_tokens))
            plain.append(new_tokens / (time.perf_counter() - t))
            t = time.perf_counter()
            for _ in eng.generate(input_ids=short, sampling_params=greedy(new_tokens), stream=True):
                pass
            streamed.append(new_tokens / (time.perf_counter() - t))
        out["decode_b1_tok_s"] = statistics.median(plain)
        out["decode_b1_streamed_tok_s"] = statistics.median(streamed)
        for batch in (16, 64):
            many = [prompt_ids(tok, 16, salt=s) for s in range(batch)]
            eng.generate(input_ids=many, sampling_params=greedy(new_tokens))  # untimed: see "First touch" above
            t = time.perf_counter()
            eng.generate(input_ids=many, sampling_params=greedy(new_tokens))
            out[f"decode_b{batch}_tok_s"] = batch * new_tokens / (time.perf_counter() - t)
        if (matmul_s := block_matmul_seconds(eng, 64)) > 0:
            out["matmul_b64_tok_s"] = 64 / matmul_s
    finally:
        eng.shutdown()
    return out


def block_matmul_seconds(eng, rows: int, reps: int = 3) -> float:
    """Seconds the engine's block-kernel weight matrices (every layer's and the head's) take for one
    step of `rows` activation rows on the engine's kernel threads, best of `reps`: a decode step of
    `rows` tokens cannot be shorter (0 where the model has no block matrices)."""
    from radixgen.runtime.kernels.block_gemm import block_linear
    from radixgen.runtime.layers.linear import BlockLinear

    panels = [m.panels for m in eng.runner.model.modules() if isinstance(m, BlockLinear)]
    xs = {k: torch.randn(rows, k) for k in {p.shape[1] for p in panels}}  # [rows, k] per input width
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for p in panels:
            block_linear(xs[p.shape[1]], p)
        best = min(best, time.perf_counter() - t)
    return best if panels else 0.0


def ours_contexts(tok, contexts: list[int], kv_dtype: str, new_tokens: int = 64) -> dict:
    from radixgen.runtime.engine import Engine

    eng = Engine(disable_radix_cache=True, kv_cache_dtype=kv_dtype, max_running_requests=8)
    try:
        eng.generate(input_ids=prompt_ids(tok, 64), sampling_params=greedy(4))  # warm-up
        return {f"decode_ctx{c}_tok_s": decode_rate(eng, prompt_ids(tok, c, salt=c), new_tokens) for c in contexts}
    finally:
        eng.shutdown()


def ours_batches(tok, batches: list[int], new_tokens: int) -> dict:
    from radixgen.runtime.engine import Engine

    eng = Engine(disable_radix_cache=True, max_running_requests=max(batches))
    try:
        eng.generate(input_ids=prompt_ids(tok, 16), sampling_params=greedy(4))  # warm-up
        out = {}
        for batch in batches:
            many = [prompt_ids(tok, 16, salt=s) for s in range(batch)]
            eng.generate(input_ids=many, sampling_params=greedy(new_tokens))  # untimed: see "First touch"
            t = time.perf_counter()
            eng.generate(input_ids=many, sampling_params=greedy(new_tokens))
            out[f"decode_b{batch}_tok_s"] = batch * new_tokens / (time.perf_counter() - t)
        return out
    finally:
        eng.shutdown()


def hf_bench(model, tok, new_tokens: int, batch: int) -> dict:
    ids = torch.tensor([prompt_ids(tok, 256)])
    with torch.no_grad():
        model(ids)  # warm-up
        t = time.perf_counter()
        model(ids)
        prefill = 256 / (time.perf_counter() - t)
        gen = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
        short = torch.tensor([prompt_ids(tok, 16)])
        t = time.perf_counter()
        model.generate(short, **gen)
        decode1 = new_tokens / (time.perf_counter() - t)
        many = torch.tensor([prompt_ids(tok, 16, salt=s) for s in range(batch)])
        t = time.perf_counter()
        model.generate(many, attention_mask=torch.ones_like(many), **gen)
        decode_b = batch * new_tokens / (time.perf_counter() - t)
    return {"prefill_tok_s": prefill, "decode_b1_tok_s": decode1, f"decode_b{batch}_tok_s": decode_b}


def probe(kind: str, new_tokens: int) -> None:
    """Subprocess body: batch-1 decode tok/s of a fresh engine, after HF transformers ran on this
    (main) thread when kind == 'hf-first'. Prints one JSON line."""
    from radixgen.runtime.engine import Engine
    from radixgen.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer()
    if kind == "hf-first":  # the user's own torch work first, on the main thread
        import transformers

        from radixgen.runtime.models.resolve import default_model_path

        path = default_model_path()
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               dtype=torch.float32).eval()
        with torch.no_grad():
            hf(torch.tensor([prompt_ids(tok, 64)]))
    eng = Engine(disable_radix_cache=True)
    try:
        short = prompt_ids(tok, 16)
        eng.generate(input_ids=short, sampling_params=greedy(8))  # warm-up
        t = time.perf_counter()
        eng.generate(input_ids=short, sampling_params=greedy(new_tokens))
        print(json.dumps({"probe": kind, "decode_b1_tok_s": new_tokens / (time.perf_counter() - t)}), flush=True)
    finally:
        eng.shutdown()


def run_probe(kind: str, new_tokens: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--probe", kind, "--new-tokens", str(new_tokens)],
                          capture_output=True, text=True, check=True)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith('{"probe"'))
    return {"decode_b1_tok_s": json.loads(line)["decode_b1_tok_s"]}


def read_bandwidth_gbs() -> float:
    """This machine's memory read bandwidth, GB/s: the best of four sums of a 512 MiB float32 tensor
    on torch's threads (a streaming read, as decode attention's)."""
    x = torch.ones(128 << 20)
    best = 0.0
    for _ in range(4):
        t = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return best


def context_ceiling(tok_s_256: float, kv_dtype: str, bandwidth_gbs: float) -> float:
    """The highest decode-at-LONG over decode-at-256 ratio the memory allows: a step at LONG reads the
    extra tokens' K and V in every layer at `bandwidth_gbs`, on top of the 256-token step."""
    from radixgen.runtime.models.loader import open_checkpoint

    cfg = open_checkpoint(None)[0]
    elem = {"auto": 4, "float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}[kv_dtype]
    head_bytes = cfg.head_dim * elem + (4 if kv_dtype == "int8" else 0)  # int8 rows carry a float scale
    extra_s = (LONG - 256) * cfg.num_layers * 2 * cfg.num_kv_heads * head_bytes / (bandwidth_gbs * 1e9)
    return (1 / tok_s_256) / (1 / tok_s_256 + extra_s)


def mean_of(runs: list[dict]) -> dict:
    return {k: statistics.mean(r[k] for r in runs) for k in runs[0]}


def emit(name: str, rnd: int, result: dict) -> None:
    print(json.dumps({"engine": name, "round": rnd, **{k: round(v, 1) for k, v in result.items()}}), flush=True)


def scale(tok, args) -> None:
    rows = ours_batches(tok, [1, 4, 16, 64, 128], args.new_tokens)
    rows.update(ours_contexts(tok, [256, 2048, LONG], args.kv_cache_dtype))
    print(json.dumps({"bench": "decode-scale", "kv_cache_dtype": args.kv_cache_dtype,
                      "threads": torch.get_num_threads(), "load_avg": os.getloadavg(),
                      **{k: round(v, 1) for k, v in rows.items()}}))


def main() -> None:
    args = build_parser().parse_args()
    if args.probe:
        return probe(args.probe, args.new_tokens)
    from radixgen.runtime.models.resolve import default_model_path
    from radixgen.runtime.threads import on_short_lived_thread
    from radixgen.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer()
    if args.scale:
        return scale(tok, args)
    path = default_model_path()
    threads = torch.get_num_threads()
    hf = None
    if not args.no_hf:
        import transformers

        hf = on_short_lived_thread(lambda: transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval())
    load_start = os.getloadavg()
    sides = ("ours", "ours-context", "llama.cpp", "hf", "clean", "hf-first")
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for rnd in range(args.rounds):
        runs["ours"].append(ours_main(tok, args.new_tokens))
        emit("radixgen", rnd, runs["ours"][-1])
        runs["ours-context"].append(ours_contexts(tok, [256, LONG], args.kv_cache_dtype))
        emit(f"radixgen-kv-{args.kv_cache_dtype}", rnd, runs["ours-context"][-1])
        if llama_cpp_peer.available():
            runs["llama.cpp"].append(on_short_lived_thread(lambda: llama_cpp_peer.bench(
                str(path), threads, prompt_ids(tok, 256), prompt_ids(tok, 16), args.new_tokens)))
            emit("llama.cpp", rnd, runs["llama.cpp"][-1])
        if hf is not None:
            runs["hf"].append(on_short_lived_thread(lambda: hf_bench(hf, tok, args.new_tokens, 16)))
            emit("hf-float32", rnd, runs["hf"][-1])
        for kind in ("clean", "hf-first"):
            runs[kind].append(run_probe(kind, args.new_tokens))
            emit(f"radixgen-{kind}-process", rnd, runs[kind][-1])
    mean = {name: mean_of(rs) for name, rs in runs.items() if rs}
    ours, ctx = mean["ours"], mean["ours-context"]
    bandwidth = on_short_lived_thread(read_bandwidth_gbs)
    ratios = {  # name: (value, bar)
        "streamed_over_non_streamed_b1": (ours["decode_b1_streamed_tok_s"] / ours["decode_b1_tok_s"], 0.97),
        "b64_over_b16_aggregate": (ours["decode_b64_tok_s"] / ours["decode_b16_tok_s"], 1.8),
        f"ctx{LONG}_over_ctx256_b1_{args.kv_cache_dtype}": (ctx[f"decode_ctx{LONG}_tok_s"] / ctx["decode_ctx256_tok_s"],
                                                           0.5),
        "hf_first_over_clean_process_b1": (mean["hf-first"]["decode_b1_tok_s"] / mean["clean"]["decode_b1_tok_s"], 0.9),
    }
    if "llama.cpp" in mean:
        peer = mean["llama.cpp"]
        amx = "amx_tile" in Path("/proc/cpuinfo").read_text()
        ratios["b1_over_llama_cpp"] = (ours["decode_b1_tok_s"] / peer["decode_b1_tok_s"], 1.5)
        ratios["prefill_over_llama_cpp"] = (ours["prefill_tok_s"] / peer["prefill_tok_s"], 6.0 if amx else 3.0)
    if "hf" in mean:
        for k in ("prefill_tok_s", "decode_b1_tok_s", "decode_b16_tok_s"):
            ratios[f"{k.removesuffix('_tok_s')}_over_hf"] = (ours[k] / mean["hf"][k], None)
    summary = {"bench": "decode", "threads": threads, "rounds": args.rounds,
               "load_avg_start_end": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
               **{k: round(v, 2) for k, (v, _) in ratios.items()},
               "memory_read_gbs": round(bandwidth, 1),
               f"ctx{LONG}_over_ctx256_bandwidth_ceiling": round(context_ceiling(
                   ctx["decode_ctx256_tok_s"], args.kv_cache_dtype, bandwidth), 2),
               "b64_over_b16_matmul_ceiling": round(ours.get("matmul_b64_tok_s", float("nan"))
                                                    / ours["decode_b16_tok_s"], 2),
               "bars_met": {k: v >= bar for k, (v, bar) in ratios.items() if bar is not None}}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
