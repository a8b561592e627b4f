"""Heavy torch work on a thread that exits, so the OpenMP thread team it starts goes with it.

Each thread that runs parallel torch ops (or our OpenMP C kernels) owns an OpenMP team for the rest
of its life. With more OpenMP threads than cores in the process, libgomp stops spinning between
parallel regions and every region pays a futex wake-up. On 2 cores, an idle team on the main thread
(left by loading weights, or by the user's own torch work) took SmolLM2's batch-1 decode on the
engine's worker thread from 125 to 78-85 tokens/s; batch 16, with longer regions, was unchanged.
The engine loads its model through `on_short_lived_thread`, and the benchmarks run HF transformers
through it, so that neither leaves a team behind for the other. The engine's scheduler thread calls
`serial_torch_on_this_thread` first: its tensor work is small, and one `flush_cache` (a 65,536-slot
`arange` on the scheduler thread) used to start a team that took batch-1 decode from ~130 to ~85
tokens/s for the rest of the engine's life.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def on_short_lived_thread(fn: Callable[[], T], name: str = "radixgen-load") -> T:
    """`fn()` run on a new thread that exits when it returns; its result, or its exception re-raised here."""
    box: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            errors.append(e)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]


@functools.cache
def _omp_set_num_threads() -> Callable[[int], None] | None:
    """libgomp's omp_set_num_threads (torch's copy: the same soname is already loaded), or None."""
    try:
        fn = ctypes.CDLL("libgomp.so.1").omp_set_num_threads
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], None
    return fn


def torch_threads_on_this_thread(n: int) -> None:
    """Run parallel torch ops issued from the calling thread on `n` OpenMP threads (1: on that thread
    alone, so it starts no OpenMP team, or its team idles and the team's workers go to sleep). Other
    threads, and torch's and MKL's process-wide settings, are untouched (unlike `torch.set_num_threads`,
    which new threads and MKL inherit). A no-op without libgomp."""
    fn = _omp_set_num_threads()
    if fn is not None:
        torch.get_num_threads()  # ATen sets up a thread's OpenMP lazily; first, so it cannot undo ours
        fn(n)


def serial_torch_on_this_thread() -> None:
    """`torch_threads_on_this_thread(1)`: the calling thread never starts an OpenMP team."""
    torch_threads_on_this_thread(1)
