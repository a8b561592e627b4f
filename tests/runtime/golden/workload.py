"""A fixed mixed workload whose outputs are recorded once (golden file) and compared on every run.

It exercises every scheduler path a refactor of the runtime could change: prefix hits (a few-shot
prefix cached, then extended by a batch), chunked prefill (a long prompt, small chunk budget),
retraction (a small KV pool), a JSON schema and a regex (jump-forward), seeded sampling, and
greedy top-5 logprobs; with the overlap schedule on and off. `python -m tests.runtime.golden.workload`
rewrites the golden file (only do that when a change of outputs is intended and explained).
"""

from __future__ import annotations

import json
from pathlib import Path

GOLDEN = Path(__file__).with_name("smollm2_golden.json")

FEW_SHOT = "".join(f"Q: What is {a} plus {b}?\nA: {a + b}\n" for a, b in [(2, 3), (7, 5), (10, 4), (6, 6), (9, 1)])
LONG = "Notes from the meeting. " + " ".join(f"Item {i} was discussed and approved." for i in range(40))
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
REGEX = r"(yes|no), because [a-z ]{4,30}\."
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


def run(engine) -> dict:
    """Every output of the workload: ids, and top-5 logprobs where asked."""
    out: dict[str, list] = {}

    def record(name: str, results: list[dict]) -> None:
        rows = []
        for r in results:
            row: dict = {"ids": r["output_ids"], "finish": r["meta_info"]["finish_reason"]["type"]}
            if "output_top_logprobs" in r["meta_info"]:
                row["top5"] = [[[round(lp, 5), t] for lp, t in step] for step in r["meta_info"]["output_top_logprobs"]]
            rows.append(row)
        out[name] = rows

    engine.flush_cache()
    engine.generate(FEW_SHOT, {**GREEDY, "max_new_tokens": 1})  # cache the shared prefix
    questions = [FEW_SHOT + f"Q: What is {a} plus {b}?\nA:" for a, b in [(3, 4), (8, 8), (12, 5), (1, 1)]]
    record("prefix_hits", engine.generate(questions, GREEDY, return_logprob=True, top_logprobs_num=5))
    record("chunked", engine.generate([LONG, LONG[:200]], GREEDY, return_logprob=True, top_logprobs_num=5))
    chat = "<|im_start|>user\nGive a person as JSON.<|im_end|>\n<|im_start|>assistant\n"
    record("json_schema", engine.generate([chat], {"temperature": 0, "max_new_tokens": 48,
                                                   "json_schema": json.dumps(SCHEMA)}))
    record("regex", engine.generate(["Is the sky blue? Answer:"], {"temperature": 0, "max_new_tokens": 32,
                                                                    "regex": REGEX}))
    record("seeded", engine.generate(["Once upon a time", "The best food is"],
                                     {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": 16, "seed": 1234,
                                      "ignore_eos": True}))
    before = engine.get_stats()["retractions"]
    prompts = [f"Story {i}: " + "the quick brown fox jumps over the lazy dog " * 6 for i in range(8)]
    record("retraction", engine.generate(prompts, {**GREEDY, "max_new_tokens": 40}))
    out["retracted"] = engine.get_stats()["retractions"] > before
    return out


def engines():
    """(name, Engine kwargs) of the recorded configurations."""
    common = dict(chunked_prefill_size=64, max_total_tokens=640, max_running_requests=16)
    return [("overlap", dict(common)), ("no_overlap", dict(common, disable_overlap=True))]


def record_all() -> dict:
    from radixgen.runtime.engine import Engine

    result = {}
    for name, kwargs in engines():
        eng = Engine(**kwargs)
        try:
            result[name] = run(eng)
        finally:
            eng.shutdown()
    return result


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(record_all()) + "\n")
    print(f"wrote {GOLDEN}")
