"""Give memory back to the OS after a large request; keep the startup heap out of garbage collection.

glibc's malloc keeps freed heap memory mapped for reuse, so the buffers of one huge request (its
body, the parsed JSON, the tokenizer's work) stay in the process's RSS after they are freed.
`MemoryTrimmer` gives them back (`common/heap.py`'s malloc_trim) on a thread after requests whose
body passed a threshold, at most once per interval.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

from radixgen.common.heap import TRIM_AVAILABLE, release_free_memory

logger = logging.getLogger("radixgen.server")
LARGE_BODY_BYTES = 1 << 20  # requests with a body at least this large trigger a trim afterwards


def freeze_startup_heap() -> int:
    """Move every object alive now (model modules, tokenizer and grammar vocabularies: ~700k objects)
    into the collector's permanent generation, so full collections skip them. Without it each full
    collection walks them all with the GIL held: ~0.3 s on a quiet machine, over a second under load,
    during which the event loop answers nothing (not even /health). Call once, after start-up and
    warm-up; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class MemoryTrimmer:
    """Trims the heap on a short-lived thread after large requests, at most once per `interval` s."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._last = 0.0
        self._pending = False
        self.trims = 0

    def after_request(self, body_bytes: int) -> None:
        """Call when a request is done; trims soon if its body was large."""
        if body_bytes < LARGE_BODY_BYTES or not TRIM_AVAILABLE:
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
        threading.Thread(target=self._run, name="radixgen-trim", daemon=True).start()

    def _run(self) -> None:
        wait = self._last + self.interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        with self._lock:
            self._pending = False
            self._last = time.monotonic()
        release_free_memory()
        self.trims += 1
