"""OpenMP teams per thread: helper threads stay serial, load threads exit (see runtime/threads.py)."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import pytest
import torch

from radixgen.runtime.engine import Engine
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.executor.step_plan import attention_share
from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.threads import on_short_lived_thread, serial_torch_on_this_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc/self/task")


def _thread_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _name_this_thread(name: bytes) -> None:
    """Set the calling thread's kernel name (comm): threads it starts from now on inherit it."""
    PR_SET_NAME = 15
    assert ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0) == 0


def _others_named(name: bytes) -> int:
    """Threads of this process other than the caller whose comm is `name`: the ones the caller started
    after naming itself (a count of all threads also moved when the earlier tests' threads exited)."""
    me, count = str(threading.get_native_id()), 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", "rb") as f:
                count += tid != me and f.read().strip() == name
        except FileNotFoundError:  # that thread exited while we listed
            pass
    return count


def test_serial_thread_runs_parallel_ops_without_a_team():
    main_threads = torch.get_num_threads()

    def work():
        serial_torch_on_this_thread()
        _name_this_thread(b"rg-serial-test")
        x = torch.randn(2000, 2000)
        y = (x * 2 + 1).sum()  # elementwise ops this size run in parallel on a thread with a team
        return torch.get_num_threads(), _others_named(b"rg-serial-test"), float(y)

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
        before = _thread_ids()
        eng.flush_cache()
        eng.generate(input_ids=[5, 6, 7, 8], sampling_params=params)
        assert not _thread_ids() - before  # none started (the earlier tests' threads may exit meanwhile)
    finally:
        eng.shutdown()


def test_steps_run_torch_serially_unless_attention_is_a_large_share(engine):
    """On SmolLM2's GGUF blocks the matrices run in the C kernels (up to `block_rows_limit()` rows,
    any number on AMX; every row but long chunks' where those run bfloat16 GEMMs; all rows where
    long chunks take fewer activation limbs, `wide_matmul_dtype` int16 / int8): the worker
    thread runs a step's torch ops serially (a parallel one left torch's OpenMP worker spinning on the
    core the kernels' worker needs), except prefill steps whose attention (torch SDPA) is over a tenth
    of the step's multiply-adds (long chunks' attention not counted where it runs in C), and steps whose
    matrices are oneDNN GEMMs (serial, they ran on one
    core); the kernels keep the engine's count either way."""
    from radixgen.runtime.kernels import ffi
    from radixgen.runtime.kernels.block_gemm import block_rows_limit

    worker = engine.scheduler.worker
    limit = block_rows_limit()
    assert worker.fast_decode_rows is not None
    team = worker.torch_team  # (the process's count may have changed since: an Engine with num_threads sets it)
    params = {"temperature": 0, "max_new_tokens": 1}
    engine.generate(input_ids=[[5, 6, 7]] * 3, sampling_params={"temperature": 0, "max_new_tokens": 6})
    assert worker.torch_threads_now == 1  # the last step decoded
    engine.generate(input_ids=[5 + i % 50 for i in range(900)], sampling_params=params)
    runner = engine.runner  # attention ~13% of a 900-token prefill: in torch, unless long chunks attend in C
    all_in_c = runner.model.wide_in_c and runner.long_attention_in_c  # (as their matrices then are)
    assert worker.torch_threads_now == (1 if all_in_c else team)
    engine.generate(input_ids=[7 + i % 53 for i in range(300)], sampling_params=params)  # no cached prefix
    wide_in_c = limit is None or engine.runner.model.wide_in_c
    assert worker.torch_threads_now == (1 if wide_in_c else team)  # ~5% of a 300-token one
    engine.generate(input_ids=[9 + i % 47 for i in range(8)], sampling_params=params)
    assert worker.torch_threads_now == 1  # 8 rows: in C on every path
    engine.generate(input_ids=[[100 + i, 5, 6, 7, 8, 9] for i in range(30)], sampling_params=params)
    in_c = limit is None or engine.runner.model.long_extend_min is not None  # 180 rows of short prompts
    assert worker.torch_threads_now == (1 if in_c else team)
    serial = on_short_lived_thread(lambda: (serial_torch_on_this_thread(), ffi.kernel_threads())[1])
    assert serial == ffi.kernel_threads()  # a serial thread keeps the kernels' count


def test_attention_share_counts_each_query_against_its_keys():
    """The share against a count of every (query, key) pair one by one, for a mixed step (a prefill
    continuing a cached prefix, a fresh prompt, a decode row)."""
    cfg = ModelConfig(arch="llama", vocab_size=100, hidden_size=64, intermediate_size=160, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16)
    prefix_lens, extend_lens = [10, 0, 37], [5, 8, 1]
    fb = ForwardBatch(input_ids=torch.zeros(14, dtype=torch.int64), positions=torch.zeros(14, dtype=torch.int64),
                      out_cache_loc=torch.zeros(14, dtype=torch.int64), req_pool_indices=torch.arange(3),
                      prefix_lens=prefix_lens, extend_lens=extend_lens, logits_indices=torch.arange(3))
    pairs = 0
    for p, e in zip(prefix_lens, extend_lens, strict=True):
        for j in range(e):  # the new token at position p + j sees keys 0 .. p + j
            pairs += p + j + 1
    attention = pairs * 2 * 4 * 16  # scores and weighted values, per head
    per_token = 64 * 4 * 16 + 2 * (64 * 2 * 16) + 4 * 16 * 64 + 3 * 64 * 160  # q, k and v, o, gate/up/down
    assert attention_share(fb, cfg) == pytest.approx(attention / (attention + 14 * per_token))
    # with extends longer than 6 tokens attending in C, only the others' pairs are torch's
    torch_pairs = sum(p + j + 1 for p, e in zip(prefix_lens, extend_lens, strict=True) if e <= 6 for j in range(e))
    torch_attention = torch_pairs * 2 * 4 * 16
    assert attention_share(fb, cfg, torch_max_extend=6) == pytest.approx(
        torch_attention / (torch_attention + 14 * per_token))
