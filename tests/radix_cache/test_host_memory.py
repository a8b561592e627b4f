"""KV buffers advised for huge pages: they behave as torch.empty tensors, and the kernel sees the advice."""

from __future__ import annotations

import sys

import pytest
import torch

from radixgen.radix_cache.host_memory import HUGE_PAGE, empty_kv_buffer
from radixgen.radix_cache.memory_pool import TokenToKVPool


def _vm_flags(address: int) -> list[str]:
    """VmFlags of the mapping holding `address`, read from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_buffer_behaves_like_a_plain_tensor(dtype: torch.dtype) -> None:
    shape = (5000, 3, 64)
    buf = empty_kv_buffer(shape, dtype, "cpu")
    assert buf.shape == shape and buf.dtype == dtype and buf.is_contiguous()
    src = torch.randn(shape).to(dtype)
    buf.copy_(src)
    assert torch.equal(buf, src)
    loc = torch.tensor([7, 4999, 0])
    buf[loc] = torch.ones(3, 3, 64, dtype=dtype)
    assert torch.equal(buf[4999], torch.ones(3, 64, dtype=dtype)) and torch.equal(buf[1], src[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_HUGEPAGE) is Linux-only")
def test_large_buffer_is_aligned_and_advised() -> None:
    buf = empty_kv_buffer((4 * HUGE_PAGE // 4,), torch.float32, "cpu")
    assert buf.data_ptr() % HUGE_PAGE == 0
    assert "hg" in _vm_flags(buf.data_ptr())  # the kernel recorded MADV_HUGEPAGE for the range


def test_small_buffer_is_plain_torch_empty() -> None:
    buf = empty_kv_buffer((16, 2, 8), torch.float32, "cpu")
    assert buf.shape == (16, 2, 8) and buf.untyped_storage().nbytes() == 16 * 2 * 8 * 4


def test_pool_buffers_use_it() -> None:
    pool = TokenToKVPool(8192, num_layers=2, num_kv_heads=3, head_dim=64, dtype=torch.float32)
    for buf in (*pool.k_buffer, *pool.v_buffer):
        assert buf.shape == (8193, 3, 64) and buf.data_ptr() % HUGE_PAGE == 0
        assert torch.all(buf[0] == 0)  # the padding slot stays finite
