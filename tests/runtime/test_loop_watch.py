"""LoopStallDump: a loop blocked past the threshold leaves every thread's stack in the file, naming the
blocking function; a loop that keeps turning leaves nothing."""

from __future__ import annotations

import asyncio
import time

import pytest

from radixgen.runtime.server.loop_watch import LoopStallDump


def blocking_callback_for_the_test() -> None:
    time.sleep(0.6)  # holds the loop thread, as a long synchronous parse would


async def _run(path, block: bool) -> None:
    with open(path, "w") as f:
        watch = LoopStallDump(0.25, file=f)
        watch.start()
        await asyncio.sleep(0.3)  # turning: the timer is re-armed every ~60 ms
        if block:
            blocking_callback_for_the_test()
        await asyncio.sleep(0.3)
        await watch.stop()


def test_a_stalled_loop_dumps_the_blocking_stack(tmp_path):
    asyncio.run(_run(tmp_path / "dump.txt", block=True))
    text = (tmp_path / "dump.txt").read_text()
    assert text.startswith("Timeout (0:00:00.25")
    assert "blocking_callback_for_the_test" in text


def test_a_turning_loop_dumps_nothing(tmp_path):
    asyncio.run(_run(tmp_path / "dump.txt", block=False))
    time.sleep(0.4)  # past the threshold after stop(): the timer was disarmed
    assert (tmp_path / "dump.txt").read_text() == ""


def test_threshold_must_be_positive():
    with pytest.raises(ValueError, match="> 0 seconds"):
        LoopStallDump(0)
