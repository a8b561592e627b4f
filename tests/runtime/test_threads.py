"""OpenMP teams per thread: helper threads stay serial, load threads exit (see runtime/threads.py)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from radixgen.runtime.engine import Engine
from radixgen.runtime.threads import on_short_lived_thread, serial_torch_on_this_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc/self/task")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_serial_thread_runs_parallel_ops_without_a_team():
    main_threads = torch.get_num_threads()

    def work():
        serial_torch_on_this_thread()
        before = _threads()
        x = torch.randn(2000, 2000)
        y = (x * 2 + 1).sum()  # elementwise ops this size run in parallel on a thread with a team
        return torch.get_num_threads(), _threads() - before, float(y)

    n, started, _ = on_short_lived_thread(work)
    assert n == 1 and started == 0
    assert torch.get_num_threads() == main_threads  # the caller's setting is untouched
    assert on_short_lived_thread(torch.get_num_threads) == main_threads  # and new threads do not inherit 1


def test_short_lived_thread_returns_and_raises():
    assert on_short_lived_thread(lambda: 41 + 1) == 42

    def boom():
        raise ValueError("bad checkpoint")

    with pytest.raises(ValueError, match="bad checkpoint"):
        on_short_lived_thread(boom)


def test_engine_flush_starts_no_team(tiny_models):
    """flush_cache rebuilds the 65,536-slot free list on the scheduler thread: that once left an idle
    OpenMP team there, which slowed every later small decode step by a third."""
    eng = Engine(str(tiny_models["llama"]), max_total_tokens=65536)
    try:
        params = {"temperature": 0, "max_new_tokens": 4}
        eng.generate(input_ids=[5, 6, 7], sampling_params=params)
        before = _threads()
        eng.flush_cache()
        eng.generate(input_ids=[5, 6, 7, 8], sampling_params=params)
        assert _threads() == before
    finally:
        eng.shutdown()


def test_decode_steps_run_torch_serially_and_kernels_in_parallel(engine):
    """On SmolLM2's GGUF blocks every matrix runs in the C kernels: the worker thread runs a decode
    step's torch ops serially (a parallel one left torch's OpenMP worker spinning on the core the
    kernels' worker needs) and other steps on torch's threads; the kernels keep the engine's count."""
    from radixgen.runtime.kernels import ffi

    worker = engine.scheduler.worker
    assert worker.serial_decode
    engine.generate(input_ids=[[5, 6, 7]] * 3, sampling_params={"temperature": 0, "max_new_tokens": 6})
    assert worker.torch_threads_now == 1  # the last step decoded
    engine.generate(input_ids=[5, 6, 7, 8, 9], sampling_params={"temperature": 0, "max_new_tokens": 1})
    assert worker.torch_threads_now == torch.get_num_threads()  # a prefill step, and no decode after it
    serial = on_short_lived_thread(lambda: (serial_torch_on_this_thread(), ffi.kernel_threads())[1])
    assert serial == torch.get_num_threads()
