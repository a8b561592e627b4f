"""The C argmax of greedy sampling (`kernels/argmax.py`) against torch's `max(-1).indices`: random
rows, rows of many ties (the first of equal maxima), maxima on the kernel's chunk edges, -inf rows
(a grammar's mask), vocabularies not multiples of its vector width; its SIMD and scalar builds."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.kernels import ffi
from radixgen.runtime.kernels.argmax import argmax_rows

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the kernels")

CHUNK = 16384  # csrc/argmax.c's logits per work item


@pytest.mark.parametrize("rows,vocab", [(1, 262144), (4, 49152), (3, 2 * CHUNK + 7), (2, 31), (1, 1)])
def test_argmax_matches_torch(kernel_build, rows, vocab):
    g = torch.Generator().manual_seed(rows * vocab)
    x = torch.randn(rows, vocab, generator=g)
    assert torch.equal(argmax_rows(x, kernel_build), x.max(-1).indices)
    ties = torch.randint(0, 3, (rows, vocab), generator=g).float()  # the largest value many times a row
    assert torch.equal(argmax_rows(ties, kernel_build), ties.max(-1).indices)


@pytest.mark.parametrize("at", [0, 31, 32, CHUNK - 1, CHUNK, 2 * CHUNK + 6])
def test_first_of_equal_maxima_across_chunks_and_lanes(kernel_build, at):
    x = torch.zeros(2, 2 * CHUNK + 7)
    x[:, at] = 5.0
    x[1, -1] = 5.0  # a later equal maximum, in the last chunk's scalar tail
    assert argmax_rows(x, kernel_build).tolist() == [at, at]


def test_masked_rows(kernel_build):
    x = torch.full((3, 1000), float("-inf"))
    x[1, 777] = -1e30
    x[2, 999] = 0.0
    assert argmax_rows(x, kernel_build).tolist() == x.max(-1).indices.tolist() == [0, 777, 999]


def test_other_dtypes_and_views_go_through():
    x = torch.randn(4, 5000)
    assert torch.equal(argmax_rows(x.bfloat16()), x.bfloat16().max(-1).indices)
    assert torch.equal(argmax_rows(x.t().contiguous().t()), x.max(-1).indices)  # a non-contiguous view
    assert argmax_rows(torch.empty(0, 10)).shape == (0,)
