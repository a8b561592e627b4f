"""Decode / prefill throughput: our engine vs HF transformers on the same SmolLM2 weights, one run.

Prints one JSON line per measurement and a summary line with ratios ours/HF:
prefill tokens/s (256-token prompt), batch-1 decode tokens/s (128 new tokens), and aggregate
batch-16 decode tokens/s. Ours is measured in float32 and bfloat16; HF in float32.

The machine's speed drifts by 20-30% over minutes (a shared VM), so ours and HF alternate for
`--rounds` rounds and the ratios use the means. Each side runs with no idle OpenMP team of the
other's in the process (ours: a fresh engine per round, shut down after; HF: loaded and run on
short-lived threads, see `radixgen.runtime.threads`): an idle team makes libgomp stop spinning
between parallel regions, which slows whoever runs next.
Usage: python benchmarks/bench_decode.py [--new-tokens 128] [--batch 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of ours then HF; ratios use the means")
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and bad flags answer before torch is imported

import torch  # noqa: E402


def prompt_ids(tok, n: int, salt: int = 0) -> list[int]:
    text = " ".join(f"word{(i * 7 + salt) % 97}" for i in range(n * 2))
    return tok.encode(text, add_special_tokens=False)[:n]


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


def ours_bench(dtype: str, tok, new_tokens: int, batch: int) -> dict:
    from radixgen.runtime.engine import Engine

    eng = Engine(dtype=dtype, disable_radix_cache=True)
    try:
        gen = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
        ids = prompt_ids(tok, 256)
        eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})  # warm-up
        t = time.perf_counter()
        eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
        prefill = 256 / (time.perf_counter() - t)
        short = prompt_ids(tok, 16)
        t = time.perf_counter()
        eng.generate(input_ids=short, sampling_params=gen)
        decode1 = new_tokens / (time.perf_counter() - t)
        many = [prompt_ids(tok, 16, salt=s) for s in range(batch)]
        t = time.perf_counter()
        eng.generate(input_ids=many, sampling_params=gen)
        decode_b = batch * new_tokens / (time.perf_counter() - t)
    finally:
        eng.shutdown()
    return {"prefill_tok_s": prefill, "decode_b1_tok_s": decode1, f"decode_b{batch}_tok_s": decode_b}


def main() -> None:
    args = build_parser().parse_args()
    import transformers

    from radixgen.runtime.models.resolve import default_model_path
    from radixgen.runtime.threads import on_short_lived_thread
    from radixgen.runtime.tokenizer import load_tokenizer

    path = default_model_path()
    tok = load_tokenizer()
    hf = on_short_lived_thread(lambda: transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval())
    runs: dict[str, list[dict]] = {"float32": [], "bfloat16": [], "hf": []}
    for rnd in range(args.rounds):
        for dtype in ("float32", "bfloat16"):
            runs[dtype].append(ours_bench(dtype, tok, args.new_tokens, args.batch))
            print(json.dumps({"engine": f"radixgen-{dtype}", "round": rnd, **runs[dtype][-1]}), flush=True)
        runs["hf"].append(on_short_lived_thread(lambda: hf_bench(hf, tok, args.new_tokens, args.batch)))
        print(json.dumps({"engine": "hf-float32", "round": rnd, **runs["hf"][-1]}), flush=True)
    mean = {name: {k: statistics.mean(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    summary = {"bench": "decode", "threads": torch.get_num_threads(), "rounds": args.rounds}
    for dtype in ("float32", "bfloat16"):
        for k, v in mean["hf"].items():
            summary[f"{dtype}_{k.removesuffix('_tok_s')}_ratio"] = round(mean[dtype][k] / v, 2)
    b = f"decode_b{args.batch}_tok_s"
    summary[f"float32_decode_b{args.batch}_ratio_per_round"] = [
        round(o[b] / h[b], 2) for o, h in zip(runs["float32"], runs["hf"], strict=True)]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
