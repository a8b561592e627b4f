"""Sampling tests run the Triton kernel on CPU through Triton's interpreter, and the C argmax and draw.

TRITON_INTERPRET is read when a kernel is decorated, so it must be set before
`radixgen.sampling.triton_kernels` is imported: here, at conftest import time.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import functools  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from radixgen.runtime.kernels import ffi  # noqa: E402
from radixgen.runtime.kernels.sampler_kernels import cpu_sampler_kernels  # noqa: E402
from radixgen.sampling import sample  # noqa: E402
from radixgen.sampling.triton_kernels import triton_sample  # noqa: E402

BACKENDS = {"torch": sample, "triton": triton_sample}
if ffi.library() is not None:  # the torch path with the C steps the CPU worker hands it
    BACKENDS["c_kernels"] = functools.partial(sample, kernels=cpu_sampler_kernels())


@pytest.fixture(params=sorted(BACKENDS))
def sample_fn(request):
    """Each test using this runs once per sampling path: fn(logits, batch, bitmask=None) -> SampleOutput."""
    return BACKENDS[request.param]



def _pack_bitmask(allowed: list[list[int]], vocab_size: int) -> torch.Tensor:
    """Independent packing: bit i of word j <-> token 32 * j + i. -> int32 [B, ceil(V/32)]."""
    W = (vocab_size + 31) // 32
    bits = np.zeros((len(allowed), W * 32), dtype=np.uint64)
    for r, toks in enumerate(allowed):
        bits[r, list(toks)] = 1
    words = (bits.reshape(len(allowed), W, 32) << np.arange(32, dtype=np.uint64)).sum(-1)
    return torch.from_numpy(words.astype(np.uint32).view(np.int32))


@pytest.fixture
def pack_bitmask():
    """fn(allowed token lists per row, V) -> int32 bitmask [B, ceil(V/32)]."""
    return _pack_bitmask
