"""Heavy torch work on a thread that exits, so the OpenMP thread team it starts goes with it.

Each thread that runs parallel torch ops (or our OpenMP C kernels) owns an OpenMP team for the rest
of its life. With more OpenMP threads than cores in the process, libgomp stops spinning between
parallel regions and every region pays a futex wake-up. On 2 cores, an idle team on the main thread
(left by loading weights, or by the user's own torch work) took SmolLM2's batch-1 decode on the
engine's worker thread from 125 to 78-85 tokens/s; batch 16, with longer regions, was unchanged.
The engine loads its model through `on_short_lived_thread`, and the benchmarks run HF transformers
through it, so that neither leaves a team behind for the other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

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
