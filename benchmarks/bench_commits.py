"""Two commits of radixgen side by side in one run: is a change (e.g. a refactor) speed-neutral?

The old commit is checked out into a temporary git worktree; the new side is this working tree (or
`--new REV`, also checked out). Each round measures both, alternating, each in a fresh process whose
`radixgen` comes from its tree while the measurement code is this tree's benchmarks
(`bench_decode.ours_main`: prefill 256 tokens, batch-1, 16 and 64 decode, float32, cache off;
`bench_prefix`: 32 requests on one ~1,000-token few-shot prefix, 16 new tokens each, cache on; and
16 requests on it with 64 new tokens, the cascade-decode case; each the median of three runs).
Ratios new/old use the means over `--rounds` rounds; the machine's speed drifts over minutes, which
alternation evens out.
Usage: python benchmarks/bench_commits.py --old REV [--new REV] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

MEASURE = r"""
import json, random, sys, time
sys.path[:0] = [{tree!r}, {bench!r}]
import radixgen
assert radixgen.__file__.startswith({tree!r}), radixgen.__file__
import bench_decode, bench_prefix
from radixgen.runtime.engine import Engine
from radixgen.runtime.tokenizer import load_tokenizer
tok = load_tokenizer()
out = {{k: v for k, v in bench_decode.ours_main(tok, 64).items()}}
rng = random.Random(0)
prefix = bench_prefix.few_shot_prefix(tok, 1000, rng)
prompts = [prefix + bench_prefix.question(tok, 50, i, rng) for i in range(32)]
eng = Engine()
try:
    bench_prefix.warm_up(eng, rng)
    for name, n, new in (("prefix32_wall_s", 32, 16), ("prefix16x64_wall_s", 16, 64)):
        walls = []
        for _ in range(3):  # the median of three: a process's first batch of a kind runs ~15% slower
            eng.flush_cache()
            walls.append(bench_prefix.run_batch(eng, prompts[:n], new)[0])
        out[name] = sorted(walls)[1]
finally:
    eng.shutdown()
print("RESULT " + json.dumps(out))
"""


def measure(tree: Path) -> dict[str, float]:
    code = MEASURE.format(tree=str(tree), bench=str(HERE))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tempfile.gettempdir())
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"measurement in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def worktree(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev], check=True,
                   capture_output=True)
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the baseline commit")
    ap.add_argument("--new", help="the commit to compare (default: this working tree)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"old": worktree(args.old, Path(tmp) / "old")}
        trees["new"] = worktree(args.new, Path(tmp) / "new") if args.new else ROOT
        try:
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for rnd in range(args.rounds):
                for side in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
                    runs[side].append(measure(trees[side]))
                    print(json.dumps({"side": side, "round": rnd, **runs[side][-1]}), flush=True)
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)])
    mean = {side: {k: statistics.mean(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}
    # new/old as a speed ratio: throughputs divide new by old, wall times old by new
    ratios = {k.removesuffix("_tok_s").removesuffix("_wall_s"):
              round(mean["new"][k] / mean["old"][k] if k.endswith("_tok_s") else mean["old"][k] / mean["new"][k], 3)
              for k in mean["old"]}
    print(json.dumps({"bench": "commits", "old": args.old, "new": args.new or "worktree", "rounds": args.rounds,
                      "speed_new_over_old": ratios, "min_ratio": min(ratios.values())}))


if __name__ == "__main__":
    main()
