"""Language-level benchmark: radixgen programs (`import radixgen as sgl`) on the in-process Engine.

Three measurements in one run on the default model (SmolLM2-135M, CPU, float32); every program is run
through `fn.run_batch(list_of_dicts, progress_bar=False)` with greedy sampling, and timed by wall clock:

(a) few-shot MMLU-style: a fixed 5-shot prefix (186 tokens: 5 hand-written questions, answers A-D)
    + one of 128 test questions generated from templates (arithmetic, capitals, largest number,
    opposites, mammals; fixed seed) + `sgl.select("answer", choices=["A", "B", "C", "D"])`.
    programs/s with the radix cache on (`Engine()`) vs off (`Engine(disable_radix_cache=True)`).
    Target: on / off >= 3x. With the cache off every program recomputes its whole ~220-token prompt
    five times (the select's prefix prefill plus one scoring request per choice), which on a slow CPU
    takes many minutes for all 128 programs; so the cache-off side runs only the first
    `--off-programs` (default 16) of them: throughput there is compute bound, so programs/s barely
    depends on the batch size once the batch fills the prefill chunks. Pass --off-programs 128 for the
    identical batch. Also reports accuracy and how many answers the two runs share.
(b) tree-of-thought-style: a shared instruction context + the program's own problem, then
    `s.fork(4)`, each branch appends "Approach i:" and gens 16 tokens (ignore_eos), then `join()`.
    programs/s cache on vs off (same programs, --tot-programs, default 16). Reported, no target.
(c) select vs generate: the same MMLU-style programs (--choice-programs, default 32, cache on, the cache
    flushed before each variant) once with `sgl.select` over 4 choices and once with 4 sequential
    `sgl.gen(max_tokens=4, ignore_eos=True)` calls, one per choice ("Option X is plausible because"),
    as a program that generates a candidate per choice would. Target: select >= 2x faster.

Each engine is loaded, warmed up (a gen, a select and a fork run once, which also compiles the token
healing constraint), used for its measurements, and shut down. Prints one JSON line per measurement
and a summary line with the ratios and whether each target is met. `--quick` shrinks the batches
(32 MMLU programs, 4 with the cache off, 4 tree-of-thought, 8 select-vs-gen) to check that the script works.
Usage: python benchmarks/bench_programs.py [--quick] [--mmlu-programs 128] [--off-programs 16] ...
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small batches (32 / 4 / 4 / 8 programs)")
    ap.add_argument("--mmlu-programs", type=int, help="MMLU-style programs, cache on (default 128; quick 32)")
    ap.add_argument("--off-programs", type=int, help="MMLU-style programs, cache off (default 16; quick 4)")
    ap.add_argument("--tot-programs", type=int, help="tree-of-thought programs (default 16; quick 4)")
    ap.add_argument("--choice-programs", type=int, help="programs in select vs gens (default 32; quick 8)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and bad flags answer before torch is imported

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import radixgen as sgl  # noqa: E402

LETTERS = ["A", "B", "C", "D"]

# ---------------------------------------------------------------------------------------------- MMLU-style data

FEW_SHOT_EXAMPLES: list[tuple[str, list[str], str]] = [
    ("What is the capital of France?", ["Berlin", "Paris", "Madrid", "Rome"], "B"),
    ("What is 7 + 5?", ["10", "11", "13", "12"], "D"),
    ("Which of these animals is a mammal?", ["Dolphin", "Shark", "Trout", "Octopus"], "A"),
    ("Which word means the opposite of 'cold'?", ["Wet", "Dark", "Hot", "Slow"], "C"),
    ("Which planet is closest to the Sun?", ["Venus", "Mercury", "Earth", "Mars"], "B"),
]
CAPITALS = [("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"),
            ("Peru", "Lima"), ("Canada", "Ottawa"), ("Norway", "Oslo"), ("Chile", "Santiago"),
            ("Germany", "Berlin"), ("Greece", "Athens"), ("Russia", "Moscow"), ("China", "Beijing"),
            ("Poland", "Warsaw"), ("Sweden", "Stockholm"), ("Portugal", "Lisbon")]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("fast", "slow"), ("light", "dark"), ("happy", "sad"),
             ("early", "late"), ("full", "empty"), ("strong", "weak"), ("open", "closed"), ("rich", "poor")]
MAMMALS = ["Dog", "Horse", "Whale", "Bat", "Elephant", "Tiger", "Rabbit", "Cow"]
NON_MAMMALS = ["Eagle", "Salmon", "Frog", "Lizard", "Spider", "Shark", "Crocodile", "Ant", "Penguin", "Snake"]
HEADER = "The following are multiple choice questions (with answers) about general knowledge.\n\n"


def format_question(question: str, options: list[str]) -> str:
    lines = [f"Question: {question}"] + [f"{c}. {o}" for c, o in zip(LETTERS, options, strict=True)]
    return "\n".join(lines) + "\nAnswer:"


FEW_SHOT = HEADER + "".join(format_question(q, o) + f" {a}\n\n" for q, o, a in FEW_SHOT_EXAMPLES)


def _place(rng: random.Random, correct: str, wrong: list[str]) -> tuple[list[str], str]:
    options = [correct, *wrong]
    rng.shuffle(options)
    return options, LETTERS[options.index(correct)]


def make_question(rng: random.Random, kind: int) -> tuple[str, list[str], str]:
    """(question, options, answer letter) from one of five templates."""
    if kind == 0:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        wrong = rng.sample([a + b + d for d in (-11, -10, -2, -1, 1, 2, 9, 10)], 3)
        return (f"What is {a} + {b}?", *_place(rng, str(a + b), [str(w) for w in wrong]))
    if kind == 1:
        country, city = rng.choice(CAPITALS)
        wrong = rng.sample([c for _, c in CAPITALS if c != city], 3)
        return (f"What is the capital of {country}?", *_place(rng, city, wrong))
    if kind == 2:
        nums = rng.sample(range(100, 1000), 4)
        best = max(nums)
        return ("Which number is the largest?", *_place(rng, str(best), [str(n) for n in nums if n != best]))
    if kind == 3:
        word, opposite = rng.choice(OPPOSITES)
        wrong = rng.sample([w for pair in OPPOSITES for w in pair if w not in (word, opposite)], 3)
        return (f"Which word means the opposite of '{word}'?", *_place(rng, opposite.capitalize(),
                                                                        [w.capitalize() for w in wrong]))
    return ("Which of these animals is a mammal?", *_place(rng, rng.choice(MAMMALS), rng.sample(NON_MAMMALS, 3)))


def make_questions(n: int, seed: int) -> list[tuple[str, str]]:
    """n (formatted question block, answer letter) pairs."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        q, options, answer = make_question(rng, i % 5)
        out.append((format_question(q, options) + " ", answer))
    return out


# ---------------------------------------------------------------------------------------------- programs


@sgl.function
def mmlu_select(s: Any, question: str) -> None:
    s += FEW_SHOT
    s += question
    s += sgl.select("answer", choices=LETTERS)


@sgl.function
def mmlu_four_gens(s: Any, question: str) -> None:
    s += FEW_SHOT
    s += question
    for c in LETTERS:
        s += f"\nOption {c} is plausible because"
        s += sgl.gen(f"why_{c}", max_tokens=4, ignore_eos=True)


TOT_CONTEXT = ("You are a careful problem solver. For the problem below, think about several different ways "
               "of solving it. Each approach should be a short, concrete plan that could be carried out step "
               "by step, and different approaches should not repeat each other.\n\n")
TOT_PROBLEMS = [
    "plan a week of meals for a family of four on a small budget",
    "find the shortest walking route that visits five parks in one city",
    "organise a library of two thousand books so that any book is found quickly",
    "reduce the electricity bill of a small office by a third",
    "teach a ten-year-old the basics of fractions in one afternoon",
    "schedule six football teams so that every team plays every other team once",
    "pack a car for a two-week camping trip without forgetting anything important",
    "choose the best location for a new bakery in a mid-sized town",
]


@sgl.function
def tree_of_thought(s: Any, problem: str) -> None:
    s += TOT_CONTEXT
    s += "Problem: "
    s += problem
    s += "\n"
    forks = s.fork(4)
    forks += lambda i: f"\nApproach {i + 1}:"
    forks += lambda i: sgl.gen("thought", max_tokens=16, ignore_eos=True)
    forks.join()


def tot_args(n: int) -> list[dict[str, str]]:
    return [{"problem": f"{TOT_PROBLEMS[i % len(TOT_PROBLEMS)]} (variant {i // len(TOT_PROBLEMS) + 1})"}
            for i in range(n)]


# ---------------------------------------------------------------------------------------------- helpers


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def timed_batch(fn: Any, args: list[dict[str, Any]]) -> tuple[float, list[Any], int]:
    """(wall seconds, states, failed programs) of one run_batch."""
    t = time.perf_counter()
    states = fn.run_batch(args, temperature=0, progress_bar=False)
    wall = time.perf_counter() - t
    return wall, states, sum(st.error() is not None for st in states)


def warm_up(engine: Any) -> None:
    """Run one of each kind of program (the token-healing probe compiles a grammar), then empty the cache."""
    mmlu_select.run(question=make_questions(1, 999)[0][0], temperature=0)
    mmlu_four_gens.run(question=make_questions(1, 998)[0][0], temperature=0)
    tree_of_thought.run(problem="write a short poem", temperature=0)
    engine.flush_cache()


def load_engine(**kwargs: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    engine = sgl.Engine(**kwargs)
    load_s = time.perf_counter() - t
    sgl.set_default_backend(engine)
    warm_up(engine)
    return engine, load_s


def close_engine(engine: Any) -> None:
    sgl.set_default_backend(None)
    engine.shutdown()
    gc.collect()


def cache_delta(engine: Any, before: dict[str, Any]) -> dict[str, Any]:
    after = engine.get_stats()
    computed = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    return {"computed_prompt_tokens": computed, "cached_prompt_tokens": cached,
            "cache_hit_rate": round(cached / (computed + cached), 4) if computed + cached else 0.0,
            "generated_tokens": after["generated_tokens"] - before["generated_tokens"]}


def measure(engine: Any, name: str, config: str, fn: Any, args: list[dict[str, Any]],
            extra: Callable[[list[Any]], dict[str, Any]] | None = None) -> dict[str, Any]:
    engine.flush_cache()
    before = engine.get_stats()
    wall, states, failed = timed_batch(fn, args)
    record = {"bench": "programs", "measurement": name, "config": config, "programs": len(args),
              "failed": failed, "wall_s": round(wall, 3), "programs_per_s": round(len(args) / wall, 3),
              **cache_delta(engine, before)}
    if extra is not None:
        record.update(extra(states))
    emit(record)
    record["_states"] = states
    return record


def answers(states: list[Any]) -> list[str | None]:
    return [st["answer"] if st.error() is None else None for st in states]


def accuracy_fn(qs: list[tuple[str, str]]) -> Callable[[list[Any]], dict[str, Any]]:
    def extra(states: list[Any]) -> dict[str, Any]:
        got = answers(states)
        return {"accuracy": round(sum(g == a for g, (_, a) in zip(got, qs, strict=False)) / len(got), 4)}

    return extra


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    args = build_parser().parse_args()

    n_mmlu = args.mmlu_programs or (32 if args.quick else 128)
    n_off = min(args.off_programs or (4 if args.quick else 16), n_mmlu)
    n_tot = args.tot_programs or (4 if args.quick else 16)
    n_choice = args.choice_programs or (8 if args.quick else 32)
    kw: dict[str, Any] = {} if args.threads is None else {"num_threads": args.threads}

    qs = make_questions(n_mmlu, args.seed)
    mmlu_args = [{"question": q} for q, _ in qs]
    choice_qs = make_questions(n_choice, args.seed + 1)
    choice_args = [{"question": q} for q, _ in choice_qs]
    tot = tot_args(n_tot)

    engine, load_s = load_engine(**kw)
    try:
        prefix_tokens = len(engine.tokenizer.encode(FEW_SHOT))
        emit({"bench": "programs", "setup": True, "engine": kw, "load_s": round(load_s, 2),
              "few_shot_prefix_tokens": prefix_tokens,
              "mmlu_prompt_tokens_mean": round(sum(len(engine.tokenizer.encode(FEW_SHOT + q)) for q, _ in qs)
                                               / len(qs), 1)})
        a_on = measure(engine, "mmlu_5shot_select", "cache_on", mmlu_select, mmlu_args, accuracy_fn(qs))
        b_on = measure(engine, "tree_of_thought_fork4", "cache_on", tree_of_thought, tot)
        c_sel = measure(engine, "choice_select", "cache_on", mmlu_select, choice_args, accuracy_fn(choice_qs))
        c_gen = measure(engine, "choice_four_gens", "cache_on", mmlu_four_gens, choice_args)
    finally:
        close_engine(engine)

    engine, load_s = load_engine(disable_radix_cache=True, **kw)
    try:
        a_off = measure(engine, "mmlu_5shot_select", "cache_off", mmlu_select, mmlu_args[:n_off],
                        accuracy_fn(qs[:n_off]))
        b_off = measure(engine, "tree_of_thought_fork4", "cache_off", tree_of_thought, tot)
    finally:
        close_engine(engine)

    same = sum(x == y for x, y in zip(answers(a_on["_states"][:n_off]), answers(a_off["_states"]), strict=True))
    mmlu_x = ratio(a_on["programs_per_s"], a_off["programs_per_s"])
    tot_x = ratio(b_on["programs_per_s"], b_off["programs_per_s"])
    select_x = ratio(c_gen["wall_s"], c_sel["wall_s"])
    emit({
        "bench": "programs", "summary": True, "quick": args.quick,
        "mmlu_cache_on_vs_off_programs_per_s": mmlu_x, "mmlu_target": 3.0,
        "mmlu_target_met": None if mmlu_x is None else mmlu_x >= 3.0,
        "mmlu_programs_on_off": [n_mmlu, n_off], "mmlu_same_answers_on_off": f"{same}/{n_off}",
        "tot_cache_on_vs_off_programs_per_s": tot_x,
        "select_vs_four_gens_speedup": select_x, "select_target": 2.0,
        "select_target_met": None if select_x is None else select_x >= 2.0,
        "failed_programs": sum(r["failed"] for r in (a_on, b_on, c_sel, c_gen, a_off, b_off)),
    })


if __name__ == "__main__":
    main()
