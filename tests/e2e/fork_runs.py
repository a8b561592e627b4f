"""Run a script many times, each in a fresh child process forked from one that has already imported
torch, transformers and radixgen (about 3 s of a run's 4 s on 2 cores), for test_clean_exit.py.

    python tests/e2e/fork_runs.py MODEL SCRIPT VARIANT RUNS OUTDIR HANG_S

Child i runs SCRIPT as `__main__` with `sgl.Engine` patched to build MODEL on one torch thread, then,
with VARIANT "shutdown", calls `sgl.get_default_backend().shutdown()`; then it ends as any script
does, through the interpreter's own exit (atexit hooks, finalization, C++ static destructors). Its
stdout and stderr go to OUTDIR/i.out and OUTDIR/i.err, its exit status (negative: the signal that
ended it) to OUTDIR/i.status. A child still running after HANG_S dumps every thread's stack to its
stderr and exits with status 1, so a hang fails the test with where it hung. The parent starts no
thread of its own before forking: it imports modules and reads the tokenizer once (so that its
imports are done), nothing else. It then moves its ~300k objects to the collector's permanent
generation (`gc.freeze()`, as the gc module's documentation advises before forking without exec):
each child's exit then does not walk them in finalization's collections (6 runs of the tour: 16.5 s
-> 12.9 s). The child's own objects (its engine, threads, requests) are collected and finalized
as in any process; the plain runs of test_clean_exit.py keep the whole heap's finalization.
"""

import faulthandler
import functools
import gc
import os
import runpy
import sys

import xgrammar  # noqa: F401 - imported here once, for every child

import radixgen as sgl
from radixgen.runtime.engine import Engine
from radixgen.runtime.tokenizer import load_tokenizer

model, script, variant, runs, outdir, hang_s = sys.argv[1:7]
load_tokenizer(model)  # imports what the tokenizer and its config need
gc.freeze()
child = None
for i in range(int(runs)):
    pid = os.fork()
    if pid == 0:
        child = i
        break
    _, status = os.waitpid(pid, 0)
    with open(os.path.join(outdir, f"{i}.status"), "w") as f:
        f.write(str(os.waitstatus_to_exitcode(status)))

if child is not None:
    for fd, ext in ((1, "out"), (2, "err")):
        target = os.open(os.path.join(outdir, f"{child}.{ext}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    faulthandler.dump_traceback_later(float(hang_s), exit=True)
    sys.argv = [script]
    sgl.Engine = functools.partial(Engine, model=model, num_threads=1)
    runpy.run_path(script, run_name="__main__")
    if variant == "shutdown":
        sgl.get_default_backend().shutdown()
