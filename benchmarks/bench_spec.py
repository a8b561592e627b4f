"""Speculative decoding (n-gram prompt lookup): tokens/s with and without it, in one run.

Four workloads, greedy, at batch 1 (requests one after another) and batch 8:
- copy: copy-heavy extraction: a ~600-token incident report per request (after a one-shot example of
  the format) and a JSON schema whose fields are sentences to quote from it (drafts mostly accepted);
- order_json: a customer's order e-mail and a JSON schema for the order (fields copied, the JSON
  around them not: drafts accepted at a middling-to-low rate);
- order_text: the same prompts without a schema (free text, drafts accepted at a middling rate);
- free: short stories, nothing to copy (drafting should stop: adaptivity).
With `--model PATH` on a random-weight GGUF (`benchmarks/synth_gguf.py`, file name synth-*), a model
bound by memory bandwidth, the text is noise and copies nothing, so every workload runs on the short
story prompts (a 1B model's prefill is slow) with benchmark-only parameters: `copy` greedy with a
logit bias on one token (the output repeats it: every draft right), `order_text` on three tokens
(drafts right at a middling rate), `order_json` greedy under the order schema (noise strings) and
`free` sampling at temperature 1 (nothing predictable); eos is ignored.
"Off" and "on" run on one engine (`speculative_algorithm="ngram"`), "off" with each request opting
out (`speculative: false`), so both sides share the process, its threads and the machine's state;
they alternate order for --rounds rounds and each ratio is the median of the rounds' on/off ratios.
Outputs must be equal on and off (greedy, and seeded sampling): differing requests are counted.
Prints one JSON line per measurement and a summary line with the ratios, mean accepted lengths and
accept rates and the speculator's fitted step cost (fixed ms, ms per row, extra ms per constrained
draft row, the worker's idle gap before a held request's step): `*_speedup` is end to end (each side
prefills the same prompts, which dilutes it), `*_decode_speedup` the decode alone (each request's
first token to its last, from meta_info).
A llama.cpp column (plain and `LlamaPromptLookupDecoding`, batch 1, same GGUF and extraction prompts,
in a subprocess after ours) is added when llama-cpp-python is installed; without it it is skipped.
Usage: python benchmarks/bench_spec.py [--rounds 5] [--requests 3] [--batch 8] [--num-threads N]
       [--model /tmp/synth-1b-q4_0.gguf] [--only copy,order_json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

NAMES = ["Alice Johnson", "Bob Smith", "Carla Mendes", "Deepak Rao", "Elena Petrova", "Farid Haddad", "Grace Lee"]
CITIES = ["Berlin", "Lisbon", "Toronto", "Osaka", "Nairobi", "Denver", "Krakow", "Austin"]
SERVICES = ["billing", "search", "checkout", "login", "inventory", "notification", "reporting"]
CAUSES = ["an expired TLS certificate on the internal load balancer",
          "a database migration that locked the orders table for eleven minutes",
          "a configuration change that halved the connection pool of the cache cluster",
          "a memory leak in the image resizing worker introduced by release 4.2",
          "a full disk on the primary log collector after a burst of debug logging"]
FIXES = ["rolled back the release and restarted the affected workers one zone at a time",
         "renewed the certificate and added an alert that fires thirty days before expiry",
         "restored the previous pool size and added a canary check to the deployment pipeline",
         "moved the migration to the maintenance window and split it into smaller batches"]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["start", "root_cause", "timeline", "fix"],
          "properties": {"start": {"type": "string"}, "root_cause": {"type": "string"}, "timeline": {"type": "string"},
                         "fix": {"type": "string"}}}
ACTIONS = ["opened a bridge call and invited the database and network teams",
           "posted a first status update for customers on the public status page",
           "compared the error graphs with the deployment log of the last two days",
           "paused all scheduled deployments until further notice",
           "asked the vendor support line whether other customers saw the same errors",
           "collected thread dumps from three of the failing workers for later analysis",
           "increased the log level of the gateway to capture the failing requests",
           "confirmed that no data had been lost or corrupted during the incident",
           "moved the on-call handover to the afternoon so the same people could follow the recovery",
           "wrote down every command that was run, with its output, in the incident channel"]
STORIES = ["a lighthouse keeper who finds a strange map", "two robots learning to cook",
           "a village where it never stops snowing", "a detective who is afraid of the dark",
           "a dragon that collects old clocks", "a girl who can talk to rivers", "the last train of the night",
           "a gardener on a spaceship", "a cat that runs a bakery", "a musician who lost her voice"]


def report(rng: random.Random) -> str:
    """A ~600-token incident report (different names, times and causes per seed)."""
    who, other = rng.sample(NAMES, 2)
    city, service = rng.choice(CITIES), rng.choice(SERVICES)
    cause, fix = rng.choice(CAUSES), rng.choice(FIXES)
    h, m = rng.randint(0, 22), rng.randint(10, 59)
    filler = [f"During the incident the {s} service kept working normally and its error rate stayed below "
              f"{rng.randint(1, 9)} in ten thousand requests." for s in rng.sample(SERVICES, 4)]
    timeline = [f"At {h:02d}:{min(m + 4 * i, 59):02d} UTC {rng.choice(NAMES)} {action}." for i, action in enumerate(
        rng.sample(ACTIONS, len(ACTIONS)))]
    parts = [
        f"Incident report {rng.randint(100, 999)}, prepared by {who} of the {city} operations team.",
        f"The incident started at {h:02d}:{m:02d} UTC, when the {service} service began returning errors "
        f"for about {rng.randint(5, 40)} percent of requests.",
        f"{other} was on call and acknowledged the first page within {rng.randint(2, 9)} minutes.",
        *filler[:2],
        f"The root cause was {cause}.",
        f"Customers in {rng.choice(CITIES)} and {rng.choice(CITIES)} were affected the most, because their "
        f"traffic is routed through the same region.",
        f"In total about {rng.randint(2, 90)} thousand requests failed, and {rng.randint(3, 60)} customers opened "
        f"support tickets, most of them asking whether their payments had gone through.",
        *filler[2:],
        "Timeline of the response:", *timeline,
        f"To fix it, the team {fix}.",
        f"The service was fully healthy again at {h + 1:02d}:{rng.randint(10, 59):02d} UTC.",
        "Follow-up actions: review the alerting thresholds, document the recovery steps in the runbook, "
        "and schedule a game day to rehearse the procedure with the whole team before the end of the quarter.",
        f"Questions about this report can be sent to {who} or to the {city} operations mailing list.",
    ]
    return " ".join(parts)


QUESTION = ("Quote from the report, word for word, as JSON: the sentence saying when the incident started, the "
            "sentence giving the root cause, the timeline of the response, and the sentence saying how it was fixed.")
EXAMPLE = ("Incident report 12, prepared by Ana Silva of the Porto operations team. The incident started at 03:10 "
           "UTC, when the email service began returning errors for about 30 percent of requests. The root cause was "
           "an expired password of the mail relay account. Timeline of the response: At 03:12 UTC Ana Silva paged "
           "the mail team. At 03:20 UTC Tom Berg found the failing logins in the relay log. To fix it, the team "
           "rotated the password and restarted the relay. The service was fully healthy again at 03:55 UTC.")
EXAMPLE_ANSWER = json.dumps({
    "start": "The incident started at 03:10 UTC, when the email service began returning errors for about 30 percent "
             "of requests.",
    "root_cause": "The root cause was an expired password of the mail relay account.",
    "timeline": "At 03:12 UTC Ana Silva paged the mail team. At 03:20 UTC Tom Berg found the failing logins in the "
                "relay log.",
    "fix": "To fix it, the team rotated the password and restarted the relay."}, separators=(",", ":"))


def extraction_prompts(n: int, seed: int) -> list[str]:
    """A one-shot example (a short report and its answer) then a ~600-token report and the question."""
    rng = random.Random(seed)
    shot = (f"<|im_start|>user\n{EXAMPLE}\n\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n{EXAMPLE_ANSWER}"
            "<|im_end|>\n")
    return [f"{shot}<|im_start|>user\n{report(rng)}\n\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
            for _ in range(n)]


def story_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"<|im_start|>user\nWrite a short story about {t}.<|im_end|>\n<|im_start|>assistant\n"
            for t in rng.sample(STORIES, n)]

PRODUCTS = [("KB-2041", "wireless keyboard with a German layout"), ("MS-0117", "ergonomic vertical mouse"),
            ("MN-2790", "27 inch monitor with a height adjustable stand"), ("HD-5503", "noise cancelling headset"),
            ("CB-0042", "USB-C docking station with two display ports"), ("LP-1337", "laptop sleeve in dark grey"),
            ("WC-0808", "full HD webcam with a privacy shutter"), ("DS-3120", "standing desk frame, black")]
STREETS = ["Lindenstrasse 14", "Rua das Flores 203", "4417 Maple Avenue", "Kurfuerstendamm 88", "12 Harbour Road"]
ORDER_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["customer", "email", "shipping_address", "items", "delivery_note"],
    "properties": {
        "customer": {"type": "string"}, "email": {"type": "string"}, "shipping_address": {"type": "string"},
        "items": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["sku", "product", "quantity"],
            "properties": {"sku": {"type": "string"}, "product": {"type": "string"}, "quantity": {"type": "integer"}}}},
        "delivery_note": {"type": "string"}}}


def order_prompts(n: int, seed: int) -> list[str]:
    """A customer's order e-mail (~250 tokens) and a request for the order as JSON: the fields are
    copied from the mail, the JSON around them is not (drafts are accepted at a middling rate)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        who = rng.choice(NAMES)
        items = rng.sample(PRODUCTS, rng.randint(2, 4))
        lines = "\n".join(f"- {rng.randint(1, 12)} x {name} (article {sku})" for sku, name in items)
        mail = (f"From: {who} <{who.split()[0].lower()}@example.com>\nSubject: Order for our {rng.choice(CITIES)} "
                f"office\n\nHello,\n\nplease send the following to {rng.choice(STREETS)}, {rng.choice(CITIES)}:\n"
                f"{lines}\n\nPlease deliver on a weekday between 9 and 17 o'clock and call {who} at the front desk "
                f"when you arrive, because the building is locked. We need everything within "
                f"{rng.randint(2, 28)} days.\n\nBest regards,\n{who}")
        out.append(f"<|im_start|>user\n{mail}\n\nExtract the order from this e-mail as JSON with the customer, "
                   "their e-mail address, the shipping address, the items (article number, product and quantity) "
                   "and the delivery note, copied word for word.<|im_end|>\n<|im_start|>assistant\n")
    return out


def run(engine, prompts: list[str], params: dict, batch: int) -> tuple[float, list[dict]]:
    """Wall seconds and results of `prompts`, `batch` at a time."""
    outs: list[dict] = []
    t = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        res = engine.generate(chunk, params)
        outs += res if isinstance(res, list) else [res]
    return time.perf_counter() - t, outs


LLAMA_CPP = """
import json, sys, time
import llama_cpp.llama as L
args = json.loads(sys.argv[1])
default_params = L.llama_cpp.llama_model_default_params
def no_extra_buffers():  # the wheel's AMX weight buffers crash (SIGSEGV in ggml_backend_amx_mul_mat) on this VM
    params = default_params()
    params.use_extra_bufts = False
    return params
L.llama_cpp.llama_model_default_params = no_extra_buffers
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
out = {}
for name, kw in (("plain", {}), ("prompt_lookup", {"draft_model": LlamaPromptLookupDecoding(num_pred_tokens=8),
                                                    "logits_all": True})):
    llm = L.Llama(args["gguf"], n_ctx=2048, verbose=False, **kw, **args["threads"])
    t, tokens = time.perf_counter(), 0
    for p in args["prompts"]:
        tokens += llm(p, max_tokens=args["max_tokens"], temperature=0)["usage"]["completion_tokens"]
    out[name] = tokens / (time.perf_counter() - t)
    del llm
print(json.dumps(out))
"""


def llama_cpp_column(prompts: list[str], max_tokens: int, threads: int | None) -> dict | str:
    """llama.cpp's tokens/s at batch 1 on the same GGUF and prompts, plain and with prompt-lookup decoding
    (no JSON schema: its grammar sampling is another cost), in a subprocess; a reason string without it."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "skipped: llama-cpp-python is not installed"
    from radixgen.runtime.models.resolve import default_model_path

    arg = json.dumps({"gguf": str(default_model_path()), "prompts": prompts, "max_tokens": max_tokens,
                      "threads": {"n_threads": threads} if threads else {}})
    proc = subprocess.run([sys.executable, "-c", LLAMA_CPP, arg], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"failed: exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
    return {k: round(v, 1) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def workloads(synthetic: bool, encode: Callable[[str], list[int]]) -> dict[str, tuple[dict, Callable]]:
    """name -> (sampling params, prompt maker). On a random-weight model (`synthetic`) the text is noise
    and nothing is copied by itself, so benchmark-only parameters make greedy text copy-heavy: a logit
    bias on one token (the output repeats it: drafts always right, the copy-heavy case) or on three
    (the output wanders among them: drafts right at a middling rate); a schema's strings are noise, and
    sampling at temperature 1 is not predictable at all (drafting must stop); eos is ignored so that
    every request makes its full length."""
    if not synthetic:
        return {
            "copy": ({"temperature": 0, "max_new_tokens": 240, "json_schema": json.dumps(SCHEMA)}, extraction_prompts),
            "order_json": ({"temperature": 0, "max_new_tokens": 160, "json_schema": json.dumps(ORDER_SCHEMA)},
                           order_prompts),
            "order_text": ({"temperature": 0, "max_new_tokens": 160}, order_prompts),
            "free": ({"temperature": 0, "max_new_tokens": 96}, story_prompts),
        }
    n = {"max_new_tokens": 64, "ignore_eos": True}  # short prompts: a 1B model's prefill is slow, and noise
    biased = encode(" the cat sat")
    return {
        "copy": ({"temperature": 0, **n, "logit_bias": {biased[0]: 100.0}}, story_prompts),
        "order_json": ({"temperature": 0, **n, "json_schema": json.dumps(ORDER_SCHEMA)}, story_prompts),
        "order_text": ({"temperature": 0, **n, "logit_bias": {t: 100.0 for t in biased[:3]}}, story_prompts),
        "free": ({"temperature": 1.0, "seed": 5, **n}, story_prompts),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="alternating off/on rounds; ratios are their median "
                    "(a batch-8 cell varies by about a tenth between identical runs on a 2-core VM)")
    ap.add_argument("--requests", type=int, default=3, help="requests per workload at batch 1 (batch runs use --batch)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--model", default=None, help="a model path (default SmolLM2-135M); a file named synth-* "
                    "(benchmarks/synth_gguf.py, random weights) gets the synthetic workloads")
    ap.add_argument("--only", default=None, help="comma-separated workloads to run (default: all)")
    args = ap.parse_args()
    from radixgen.runtime.engine import Engine

    synthetic = args.model is not None and Path(args.model).name.startswith("synth")
    eng = Engine(model=args.model, speculative_algorithm="ngram", num_threads=args.num_threads)
    loads = workloads(synthetic, lambda text: eng.tokenizer.encode(text, add_special_tokens=False))
    if args.only:
        loads = {k: v for k, v in loads.items() if k in args.only.split(",")}
    ratios: dict[str, list[float]] = {}  # per round: on/off tokens/s, end to end
    decode_ratios: dict[str, list[float]] = {}  # per round: on/off decode tokens/s (first token to last)
    tok_s: dict[str, list[float]] = {}
    accept: dict[str, list[float]] = {}
    rates: dict[str, list[float]] = {}
    flips: dict[str, int] = {}
    try:
        eng.generate(story_prompts(1, 99)[0], {"max_new_tokens": 8})  # warm-up
        for rnd in range(args.rounds):
            for name, (params, make) in loads.items():
                for batch, count in ((1, args.requests), (args.batch, args.batch)):
                    prompts = make(count, 1000 * rnd + batch)
                    key = f"{name}_b{batch}"
                    results, rate, decode = {}, {}, {}
                    for mode in (("off", "on") if rnd % 2 == 0 else ("on", "off")):
                        while not eng.flush_cache():  # each side prefills the same prompts (a request just
                            time.sleep(0.01)  # finished may hold its KV until its last step lands)
                        wall, outs = run(eng, prompts, {**params, "speculative": mode == "on"}, batch)
                        results[mode] = outs
                        n = sum(len(o["output_ids"]) for o in outs)
                        rate[mode] = n / wall
                        decode[mode] = (n - len(outs)) / sum(
                            o["meta_info"]["e2e_latency"] - o["meta_info"]["first_token_latency"] for o in outs)
                        tok_s.setdefault(f"{key}_{mode}", []).append(rate[mode])
                        line = {"workload": name, "batch": batch, "mode": mode, "round": rnd, "tokens": n,
                                "wall_s": round(wall, 2), "tok_s": round(n / wall, 1)}
                        if mode == "on":
                            verify = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
                            proposed = sum(o["meta_info"]["spec_num_proposed_drafts"] for o in outs)
                            accept.setdefault(key, []).append(n / verify)
                            rates.setdefault(key, []).append(
                                sum(o["meta_info"]["spec_num_correct_drafts"] for o in outs) / max(proposed, 1))
                            line.update(accept_length=round(n / verify, 2), accept_rate=round(rates[key][-1], 2),
                                        proposed_per_token=round(proposed / n, 2))
                        print(json.dumps(line), flush=True)
                    ratios.setdefault(key, []).append(rate["on"] / rate["off"])
                    decode_ratios.setdefault(key, []).append(decode["on"] / decode["off"])
                    flips[key] = flips.get(key, 0) + sum(
                        a["output_ids"] != b["output_ids"] for a, b in zip(results["off"], results["on"], strict=True))
        speculator = eng.scheduler.speculator
        costs = {b: speculator.costs.model(b) for b in (1, args.batch)}  # (fixed, per row, per grammar row) s
        gap = speculator.gap
    finally:
        eng.shutdown()
    summary: dict = {"bench": "spec", "model": args.model or "SmolLM2-135M", "rounds": args.rounds,
                     "batch": args.batch, "hold_gap_ms": round(gap * 1e3, 2) if gap is not None else None}
    for b, (fixed, per_row, per_grammar) in costs.items():  # the speculator's fit (in row-costs if never timed)
        summary[f"b{b}_step_fixed_ms"] = round(fixed * 1e3, 2)
        summary[f"b{b}_row_ms"] = round(per_row * 1e3, 2)
        summary[f"b{b}_grammar_row_ms"] = round(per_grammar * 1e3, 2)
    for key in ratios:
        summary[f"{key}_speedup"] = round(statistics.median(ratios[key]), 2)  # median over rounds
        summary[f"{key}_speedups"] = [round(r, 2) for r in ratios[key]]
        summary[f"{key}_decode_speedup"] = round(statistics.median(decode_ratios[key]), 2)
        summary[f"{key}_tok_s_off"] = round(statistics.median(tok_s[f"{key}_off"]), 1)
        summary[f"{key}_tok_s_on"] = round(statistics.median(tok_s[f"{key}_on"]), 1)
        summary[f"{key}_mean_accept_length"] = round(statistics.mean(accept[key]), 2)
        summary[f"{key}_accept_rate"] = round(statistics.mean(rates[key]), 2)
        summary[f"{key}_outputs_differing"] = flips[key]
    if not synthetic and "copy" in loads:
        peer = llama_cpp_column(extraction_prompts(args.requests, seed=1), 240, args.num_threads)  # round 0 b1 prompts
        summary["llama_cpp_copy_b1_tok_s"] = peer
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
