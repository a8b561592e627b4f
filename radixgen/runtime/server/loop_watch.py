"""A debugging aid for event-loop stalls: dump every thread's Python stack when the loop stops turning.

While the event loop runs callbacks it answers nothing, /health included. `LoopStallDump` re-arms
`faulthandler.dump_traceback_later` from a task on the loop every `period` seconds. If the loop does
not get back to that task within `after` seconds, faulthandler's own C thread (which needs no GIL)
writes the stacks of all threads to `file` at that moment: the thread that holds the GIL, or the
loop thread stuck in a long callback, is caught in the act. Enabled by `radixgen serve
--loop-stall-dump SECONDS`; faulthandler has one such timer per process, so one watcher at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import sys
from typing import IO


class LoopStallDump:
    """Dumps all threads' stacks to `file` when the running loop stalls for `after` seconds."""

    def __init__(self, after: float, file: IO[str] | None = None) -> None:
        if after <= 0:
            raise ValueError(f"loop stall threshold must be > 0 seconds, got {after!r}")
        self.after = after
        self.period = min(0.1, after / 4)
        self.file = file or sys.stderr
        self._task: asyncio.Task | None = None

    async def _rearm(self) -> None:
        while True:
            faulthandler.dump_traceback_later(self.after, repeat=False, file=self.file, exit=False)
            await asyncio.sleep(self.period)

    def start(self) -> None:
        """Start watching the running loop (call from a coroutine on it)."""
        self._task = asyncio.get_running_loop().create_task(self._rearm(), name="radixgen-loop-stall-dump")

    async def stop(self) -> None:
        """Stop watching and disarm the timer."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        faulthandler.cancel_dump_traceback_later()
