"""Tensor parallelism on CPU: tp=1 vs tp=2 step time on a SmolLM2-sized model, and what the communication costs.

SmolLM2-135M has 9 query heads, which 2 ranks cannot split, so the model here is SmolLM2's shape with
8 query / 2 KV heads (hidden 576, 30 layers, MLP 1536, its 49,152-token vocabulary and tokenizer)
and random weights (step time does not depend on their values), written to a temporary directory.
Two engines in one run, one after the other, both on dense float32 weights: tp=1 and tp=2 (two
processes, gloo). For each: a prefill of `--prefill-tokens` (one step), and greedy decoding at batch
1 and batch 8; step time = wall / forward steps (the scheduler's count). Under tp=2
the time rank 0 spends inside collectives (batch broadcast, all-reduces, logits gather; waiting for
the other rank included) is measured by wrapping its group's methods, and reported per step.

Honest expectation on this machine: 2 shared cores, so two ranks split the same cores that one
process already uses; there is no gain to expect, and the figure shows the cost per step of the
broadcast and the 2 all-reduces per layer. A GPU run needs several GPUs, which this project's lent
device (one GPU) cannot give.

Prints one JSON line per measurement and a summary with the tp=2 / tp=1 step-time ratios.
Usage: python benchmarks/bench_tp.py [--decode-tokens 16] [--prefill-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixgen.runtime.engine import Engine  # noqa: E402

WORDS = "river apple stone cloud garden silver window market orange forest engine paper bridge candle".split()


def build_model(out: Path) -> Path:
    """A SmolLM2-shaped Llama with 8 query / 2 KV heads and random weights, with SmolLM2's tokenizer."""
    import transformers

    from radixgen.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=576, intermediate_size=1536,
                                   num_hidden_layers=30, num_attention_heads=8, num_key_value_heads=2,
                                   max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=1,
                                   eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).float().save_pretrained(out, safe_serialization=True)
    tok.hf.save_pretrained(out)
    return out


def timed_collectives(group) -> dict[str, float]:
    """Wrap the group's collectives with a timer; returns the running totals (seconds, calls)."""
    totals = {"seconds": 0.0, "calls": 0}
    for name in ("all_reduce", "gather_first", "send_batch"):
        inner = getattr(group, name)

        def wrapped(*args, _inner=inner):
            t = time.perf_counter()
            try:
                return _inner(*args)
            finally:
                totals["seconds"] += time.perf_counter() - t
                totals["calls"] += 1

        setattr(group, name, wrapped)
    return totals


def measure(label: str, args: argparse.Namespace, **config) -> dict:
    eng = Engine(max_total_tokens=8192, max_running_requests=16, **config)
    comm = timed_collectives(eng.runner.group) if config.get("tp_size", 1) > 1 else None
    prompt = " ".join(WORDS[i % len(WORDS)] for i in range(args.prefill_tokens))
    out: dict = {"engine": label}
    try:
        eng.generate("warm up", {"max_new_tokens": 4})
        for name, prompts, n in (("prefill", [prompt], 1), ("decode_b1", ["Once upon a time"], args.decode_tokens),
                                 ("decode_b8", [f"Story {i}: once upon a time" for i in range(8)],
                                  args.decode_tokens)):
            eng.flush_cache()
            steps0 = eng.get_stats()["forward_steps"]
            c0 = dict(comm) if comm else None
            t = time.perf_counter()
            eng.generate(prompts, {"temperature": 0, "max_new_tokens": n, "ignore_eos": True})
            wall = time.perf_counter() - t
            steps = eng.get_stats()["forward_steps"] - steps0
            row = {"wall_s": round(wall, 3), "steps": steps, "step_ms": round(1000 * wall / steps, 2)}
            if comm:
                row["comm_ms_per_step"] = round(1000 * (comm["seconds"] - c0["seconds"]) / steps, 2)
                row["collectives_per_step"] = round((comm["calls"] - c0["calls"]) / steps, 1)
            out[name] = row
    finally:
        eng.shutdown()
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--prefill-tokens", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_model(Path(tmp)))
        tp1 = measure("tp1", args, model=model)
        tp2 = measure("tp2", args, model=model, tp_size=2)
    summary = {"summary": "tp2 step time / tp1 step time (2 shared CPU cores: no gain expected)"}
    for key in ("prefill", "decode_b1", "decode_b8"):
        summary[f"{key}_tp2_over_tp1"] = round(tp2[key]["step_ms"] / tp1[key]["step_ms"], 2)
        summary[f"{key}_tp2_comm_share"] = round(tp2[key]["comm_ms_per_step"] / tp2[key]["step_ms"], 2)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
