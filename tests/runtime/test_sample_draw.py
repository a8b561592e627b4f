"""The C draw of the CPU sampler (`kernels/sample_draw.py`) against the torch sampler's own draw
(`torch_ops.draw_tokens`) on the same uniforms: a batch mixing every parameter and processing step
(as the Triton kernel is checked), and 262k-token rows whose top-p nucleus is wider than torch's
candidate set (its full-sort case); its SIMD and scalar builds. Frequencies against a float64 reference
are `tests/sampling/test_distribution.py`'s, run on this path too."""

from __future__ import annotations

import functools

import pytest
import torch

from radixgen.runtime.kernels import ffi
from radixgen.runtime.kernels.sample_draw import draw_rows
from radixgen.sampling import SamplingBatch, SamplingParams, sample
from radixgen.sampling.torch_ops import SamplerKernels
from tests.sampling.conftest import _pack_bitmask
from tests.sampling.test_triton_kernels import _mixed_batch

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the kernels")


def test_mixed_batch_draws_equal_torch(kernel_build):
    logits, batch, bitmask = _mixed_batch(300, 257, seed=0, pack_bitmask=_pack_bitmask)
    ref = sample(logits, batch, bitmask).next_token_ids
    kernels = SamplerKernels(draw=functools.partial(draw_rows, lib=kernel_build))
    ours = sample(logits, batch, bitmask, kernels).next_token_ids
    # the same uniforms and cuts: tokens agree except where a float-rounding tie sits on a cut or the CDF
    assert (ours == ref).float().mean().item() >= 0.99


@pytest.mark.parametrize("params", [dict(temperature=1.0, top_p=0.95), dict(temperature=0.7, top_k=64, top_p=0.9),
                                    dict(temperature=1.3, min_p=0.05), dict(temperature=0.8)])
def test_large_vocabulary_rows_equal_torch(kernel_build, params):
    """Gemma's vocabulary, logits of std 1: a top-p nucleus of tens of thousands of tokens."""
    g = torch.Generator().manual_seed(0)
    rows, vocab = 24, 262144
    logits = torch.randn(rows, vocab, generator=g)
    p = SamplingParams(**params)
    batch = SamplingBatch.build([p] * rows, [[]] * rows, list(range(rows)), vocab, [], "cpu")
    ours = draw_rows(logits, batch, kernel_build)
    ref = sample(logits, batch).next_token_ids
    assert (ours == ref).sum().item() >= rows - 1  # seen: all equal


def test_cuts_keep_ties_and_masked_rows_draw_their_one_token(kernel_build):
    logits = torch.full((3, 1000), float("-inf"))
    logits[0, [10, 20, 30]] = 1.0  # three equal best tokens: top-k 2 keeps all three (ties kept)
    logits[1, 777] = 0.0  # a grammar left one token
    logits[2, :] = 0.0  # all equal: top-p 0.5 keeps every tie of the cut value
    params = [SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=0.5, top_p=0.3),
              SamplingParams(temperature=1.0, top_p=0.5)]
    seen: list[set[int]] = [set(), set(), set()]
    for seed in range(60):
        batch = SamplingBatch.build(params, [[]] * 3, [seed] * 3, 1000, [], "cpu")
        ours = draw_rows(logits, batch, kernel_build)
        assert torch.equal(ours, sample(logits, batch).next_token_ids)
        for r in range(3):
            seen[r].add(int(ours[r]))
    assert seen[0] == {10, 20, 30} and seen[1] == {777} and len(seen[2]) > 30
