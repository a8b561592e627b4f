"""User scripts exit with status 0, with or without `shutdown()` (issue 40, "programs abort at exit").

The README tour (examples/tour.py) and a file of SGLang-style programs (exit_programs.py, which ends
with a fork never joined and a streaming program still generating) run 20 times with the script
ending on its own and 20 times followed by `sgl.get_default_backend().shutdown()`. Before the fix
about one run in three ended in "terminate called without an active exception" (SIGABRT, 134): at
interpreter exit a daemon thread (the engine's worker in a torch op) re-took the GIL during
finalization, CPython ended it with pthread_exit, and the forced unwind left a noexcept C++
destructor (radixgen/common/exit_hooks.py tells the whole story).

Every run is its own process, exiting through the interpreter's normal exit. So that 80 runs fit in
about a minute on 2 cores, the 20 runs of a variant are children forked from one process that has
imported torch, transformers and radixgen once (fork_runs.py); one more run per variant is a plain
`python` process. Each run gets a tiny random Llama (tests/conftest.py, with the real SmolLM2
tokenizer) through a patched `sgl.Engine`, on one torch thread; the scripts run as they are.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RUNS = 20  # per script and variant
VARIANTS = ("exit", "shutdown")  # the script ends on its own / then the default backend is shut down
HANG_S = 120  # seconds after which a run dumps every thread's stack and fails (a run takes 2-5 s)
PLAIN = f"""
import faulthandler, functools, runpy, sys
faulthandler.dump_traceback_later({HANG_S}, exit=True)  # a hang fails with every thread's stack
import radixgen as sgl
from radixgen.runtime.engine import Engine
sgl.Engine = functools.partial(Engine, model=sys.argv[1], num_threads=1)
runpy.run_path(sys.argv[2], run_name="__main__")
if sys.argv[3] == "shutdown":
    sgl.get_default_backend().shutdown()
"""
BAD_STDERR = re.compile(r"terminate|abort|fatal python error|core dumped|segmentation", re.I)
SCRIPTS = {  # script -> a pattern its output matches once it has run to its end
    "examples/tour.py": r"is_capital=(True|False)\n.*\n$",  # the card, then the streamed answer
    "tests/e2e/exit_programs.py": r"\ndone\n$",
}
ENV = {**os.environ, "PYTHONFAULTHANDLER": "1", "TOKENIZERS_PARALLELISM": "false"}


def forked_runs(model: Path, script: str, variant: str, outdir: Path) -> list[tuple[str, int, str, str]]:
    """(label, exit status, stdout, stderr) of RUNS forked runs (fork_runs.py)."""
    outdir.mkdir()
    cmd = [sys.executable, str(ROOT / "tests/e2e/fork_runs.py"), str(model), script, variant, str(RUNS), str(outdir),
           str(HANG_S)]
    subprocess.run(cmd, cwd=ROOT, env=ENV, check=True, timeout=600)
    return [(f"{variant} run {i}", int((outdir / f"{i}.status").read_text()), (outdir / f"{i}.out").read_text(),
             (outdir / f"{i}.err").read_text()) for i in range(RUNS)]


def plain_run(model: Path, script: str, variant: str) -> list[tuple[str, int, str, str]]:
    r = subprocess.run([sys.executable, "-c", PLAIN, str(model), script, variant], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
    return [(f"{variant} plain run", r.returncode, r.stdout, r.stderr)]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_script_exits_cleanly(script, tiny_models, tmp_path):
    model = tiny_models["llama"]
    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(forked_runs, model, script, v, tmp_path / v) for v in VARIANTS]
        jobs += [pool.submit(plain_run, model, script, v) for v in VARIANTS]
        runs = [run for job in jobs for run in job.result()]
    assert len(runs) == 2 * RUNS + 2
    failures = [f"{label}: exit status {status}\nstdout: ...{out[-300:]}\nstderr: {err[-6000:]}"
                for label, status, out, err in runs
                if status != 0 or BAD_STDERR.search(err) or not re.search(SCRIPTS[script], out)]
    assert not failures, f"{len(failures)} of {len(runs)} runs of {script} failed; first:\n{failures[0]}"
