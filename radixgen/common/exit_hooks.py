"""Clean-up at interpreter exit, in stages: programs drain, then engines stop, then compile threads end.

Why this exists. CPython (3.13 and older) ends a thread that wants the GIL after finalization has
begun with `pthread_exit()`, which unwinds the thread's stack by force. A daemon thread returning
from a native call that released the GIL (every torch op, through pybind11's `gil_scoped_release`;
xgrammar through nanobind; tokenizers through pyo3) unwinds out of the destructor that takes the GIL
back; that destructor is `noexcept`, so the C++ runtime calls `std::terminate`: "terminate called
without an active exception", SIGABRT, exit status 134, after the program printed all its output. A
core dump of the README tour showed exactly that: the engine's worker thread in `torch.max` ->
`~gil_scoped_release` -> `PyEval_RestoreThread` -> `pthread_exit` -> `std::terminate`, while the
main thread was in `Py_FinalizeEx`.

So every radixgen thread that may run native code is stopped and joined from `atexit`, before
finalization, in an order in which nothing waits on what was already stopped: the language's program
threads finish what they were given (`PROGRAMS`, as SGLang's non-daemon program threads would), the
engines stop their scheduler / worker / observer threads (`ENGINES`), then the grammar caches wait for
compiles still running (`COMPILERS`). Threads blocked in a plain lock or queue wait are harmless: they
never wake, so they are left alone.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

PROGRAMS = 0  # radixgen.lang: streaming bodies return, program executors drain their queues
ENGINES = 1  # engines (and Runtime servers) stop; requests still in flight finish with "abort"
COMPILERS = 2  # grammar caches join their compile threads

_lock = threading.Lock()
_hooks: dict[int, tuple[int, Callable[[], Any]]] = {}  # key -> (stage, hook)
_keys = itertools.count()


def at_exit(fn: Callable[[], Any], stage: int, *, weak: bool = False) -> Callable[[], None]:
    """Call `fn()` at interpreter exit in `stage` (lower stages first; within a stage the latest
    registered first, as `atexit` does). With `weak`, `fn` is a bound method held by a weak reference:
    an object collected before exit is skipped. Returns a function that cancels the hook (idempotent)."""
    hook = _weak_call(weakref.WeakMethod(fn)) if weak else fn  # type: ignore[arg-type]
    key = next(_keys)
    with _lock:
        _hooks[key] = (stage, hook)

    def cancel() -> None:
        with _lock:
            _hooks.pop(key, None)

    return cancel


def _weak_call(method: weakref.WeakMethod) -> Callable[[], None]:
    """A hook calling `method` while its object lives."""
    def call() -> None:
        bound = method()
        if bound is not None:
            bound()

    return call


def run_exit_hooks() -> None:
    """Run (once) every registered hook, stage by stage; what `atexit` calls. A hook that raises, or a
    Ctrl-C while one waits, is logged and the later hooks still run."""
    with _lock:
        hooks = sorted(_hooks.items(), key=lambda item: (item[1][0], -item[0]))
        _hooks.clear()
    for _, (_, hook) in hooks:
        try:
            hook()
        except BaseException:  # noqa: B036 - at exit: report and go on with the other hooks
            logger.exception("radixgen clean-up at exit failed")


atexit.register(run_exit_hooks)
