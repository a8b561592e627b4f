"""Constrained decoding cost on SmolLM2 at batch 16, in one run.

1. tokens/s of JSON-schema-constrained vs unconstrained generation (jump-forward off, so the
   figure is the bitmask cost alone; target >= 0.9x; llama.cpp manages 0.70x on this machine);
2. jump-forward on vs off on a schema with long fixed keys: forward steps and wall time
   (targets: >= 1.3x fewer steps, >= 1.2x faster).
Compile times and per-token mask-fill cost vs raw xgrammar are in bench_grammar_compile.py.
Usage: python benchmarks/bench_grammar.py [--batch 16] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import time


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and bad flags answer before torch is imported


from radixgen.runtime.engine import Engine  # noqa: E402

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "maxLength": 24},
        "customer_account_identifier": {"type": "integer", "minimum": 0, "maximum": 99999},
        "customer_is_currently_active": {"type": "boolean"},
        "customer_preferred_contact_method": {"enum": ["email", "phone", "letter"]},
        "customer_favourite_product_category": {"type": "string", "maxLength": 24},
    },
    "required": ["customer_full_name", "customer_account_identifier", "customer_is_currently_active",
                 "customer_preferred_contact_method", "customer_favourite_product_category"],
}
PROSE_REGEX = r"[A-Za-z ,.'!?]*"


def run(engine: Engine, prompts: list[str], params: list[dict]) -> dict:
    before = engine.get_stats()
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - t
    after = engine.get_stats()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"wall_s": round(wall, 3), "completion_tokens": tokens, "tok_s": round(tokens / wall, 1),
            "forward_steps": after["forward_steps"] - before["forward_steps"],
            "jump_tokens": after["jump_forward_tokens"] - before["jump_forward_tokens"]}


def main() -> None:
    args = build_parser().parse_args()
    b, n = args.batch, args.new_tokens
    prompts = [CHAT.format(f"Write story number {i}.") for i in range(b)]
    results = {}
    eng = Engine(disable_jump_forward=True)
    try:
        eng.generate(prompts[:2], {"max_new_tokens": 4, "regex": PROSE_REGEX})  # warm-up + compile
        free = [{"temperature": 0.8, "seed": i, "max_new_tokens": n, "ignore_eos": True} for i in range(b)]
        results["unconstrained"] = run(eng, prompts, free)
        # a constraint every row stays inside for exactly n tokens (min_new_tokens bans an early end),
        # so both arms decode the same number of tokens per row
        cons = [dict(p, regex=PROSE_REGEX, min_new_tokens=n, ignore_eos=False) for p in free]
        results["constrained"] = run(eng, prompts, cons)
        record = [CHAT.format(f"Make up customer record {i} as JSON.") for i in range(b)]
        rec_params = [{"temperature": 0.7, "seed": i, "max_new_tokens": 160, "json_schema": json.dumps(LONG_KEYS)}
                      for i in range(b)]
        results["jump_off"] = run(eng, record, rec_params)
    finally:
        eng.shutdown()
    eng = Engine()
    try:
        eng.generate(record[:2], rec_params[:2])  # warm-up + compile
        results["jump_on"] = run(eng, record, rec_params)
    finally:
        eng.shutdown()
    for name, r in results.items():
        print(json.dumps({"bench": "grammar", "case": name, "batch": b, **r}))
    r = results
    print(json.dumps({
        "bench": "grammar", "summary": True,
        "constrained_over_unconstrained_tok_s": round(r["constrained"]["tok_s"] / r["unconstrained"]["tok_s"], 3),
        "jump_forward_fewer_steps": round(r["jump_off"]["forward_steps"] / r["jump_on"]["forward_steps"], 2),
        "jump_forward_speedup": round(r["jump_off"]["wall_s"] / r["jump_on"]["wall_s"], 2),
    }))


if __name__ == "__main__":
    main()
