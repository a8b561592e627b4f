"""The C kernels' own threads (csrc/thread_pool.c): results independent of the thread count and of
which thread ran which items, concurrent callers (a busy pool runs a region on its caller), a forked
child, and no OpenMP runtime in the library (torch's teams cannot slow it)."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest
import torch

from radixgen.runtime.kernels import build, ffi
from radixgen.runtime.kernels import decode_attention as attn
from radixgen.runtime.kernels.block_gemm import block_linear, pack_panels
from radixgen.runtime.kernels.gguf_blocks import from_gguf
from tests.runtime.test_block_gemm import random_gguf

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the kernels")


def with_threads(n: int, fn):
    """fn() with torch (whose thread count the kernel wrappers pass on) set to n threads, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def gemm_case(m: int) -> tuple:
    w = pack_panels(from_gguf(random_gguf("Q4_1", 200, 256, seed=m), "Q4_1"))
    return w, torch.randn(m, 256, generator=torch.Generator().manual_seed(m))


def attention_case() -> tuple:
    """Two requests, one long enough to be split into several chunks over the threads."""
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([700, 37])
    k = torch.randn(800, 2, 64, generator=g)
    v = torch.randn(800, 2, 64, generator=g)
    table = torch.zeros(2, 720, dtype=torch.int64)
    table[0, :700] = torch.randperm(799, generator=g)[:700] + 1
    table[1, :37] = torch.arange(1, 38)
    q = torch.randn(2, 6, 64, generator=g)
    return q, k, v, table, torch.tensor([0, 1]), lens


def test_results_do_not_depend_on_the_thread_count():
    for m in (1, 20, 64):
        w, x = gemm_case(m)
        one = with_threads(1, lambda: block_linear(x, w))  # noqa: B023
        for n in (2, 3, 4):
            assert torch.equal(with_threads(n, lambda: block_linear(x, w)), one)  # noqa: B023
    case = attention_case()
    one = with_threads(1, lambda: attn.decode_attention(*case, 0.125, return_lse=True))
    for n in (2, 4):
        for a, b in zip(with_threads(n, lambda: attn.decode_attention(*case, 0.125, return_lse=True)), one,
                        strict=True):
            assert torch.equal(a, b)


def test_concurrent_callers_get_their_own_results():
    """Four Python threads run kernels at once (ctypes releases the GIL): one region runs on the pool,
    the others on their callers, and every result is the serial one."""
    cases = [gemm_case(m) for m in (1, 8, 20, 40)]
    expect = [with_threads(1, lambda w=w, x=x: block_linear(x, w)) for w, x in cases]
    errors: list[str] = []

    def hammer(i: int) -> None:
        w, x = cases[i]
        for _ in range(30):
            if not torch.equal(block_linear(x, w), expect[i]):
                errors.append(f"case {i} differs")
                return

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(len(cases))]
    with_threads(2, lambda: [t.start() for t in threads] and [t.join() for t in threads])
    assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() only")
def test_a_forked_child_runs_the_kernels():
    """After fork() the child has none of the parent's pool workers (threads do not survive fork): it
    starts its own and gets the parent's results."""
    w, x = gemm_case(20)
    expect = with_threads(2, lambda: block_linear(x, w))  # the parent's pool has workers now
    pid = os.fork()
    if pid == 0:  # child: exit 0 only if the kernel returns the same result
        ok = torch.equal(with_threads(2, lambda: block_linear(x, w)), expect)
        os._exit(0 if ok else 1)
    deadline = threading.Event()
    for _ in range(600):  # 60 s
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        deadline.wait(0.1)
    os.kill(pid, 9)
    pytest.fail("the forked child hung in the kernel")


def test_the_library_has_no_openmp_runtime():
    """The kernels link no libgomp/libomp, so torch's OpenMP teams (the user's own torch work) cannot
    throttle them; `readelf -d` lists the shared libraries the build needs."""
    path = build.build("native")
    needed = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    assert "libc.so" in needed  # the listing is there
    assert "gomp" not in needed and "libomp" not in needed, needed
