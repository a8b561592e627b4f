"""Decode / prefill throughput: our engine vs HF transformers on the same SmolLM2 weights, one run.

Prints one JSON line per measurement and a summary line with ratios ours/HF:
prefill tokens/s (256-token prompt), batch-1 decode tokens/s (128 new tokens), and aggregate
batch-16 decode tokens/s. Ours is measured in float32 and bfloat16; HF in float32.
Usage: python benchmarks/bench_decode.py [--new-tokens 128] [--batch 16]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


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
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    import transformers

    from radixgen.runtime.models.resolve import default_model_path
    from radixgen.runtime.tokenizer import load_tokenizer

    path = default_model_path()
    tok = load_tokenizer()
    results = {}
    for dtype in ("float32", "bfloat16"):
        results[f"ours_{dtype}"] = ours_bench(dtype, tok, args.new_tokens, args.batch)
        print(json.dumps({"engine": f"radixgen-{dtype}", **results[f"ours_{dtype}"]}), flush=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    results["hf"] = hf_bench(hf, tok, args.new_tokens, args.batch)
    print(json.dumps({"engine": "hf-float32", **results["hf"]}), flush=True)
    summary = {"bench": "decode", "threads": torch.get_num_threads()}
    for dtype in ("float32", "bfloat16"):
        for k, v in results["hf"].items():
            summary[f"{dtype}_{k.removesuffix('_tok_s')}_ratio"] = round(results[f"ours_{dtype}"][k] / v, 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
