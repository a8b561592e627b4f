"""Sampler: backend resolution, boundary checks, dtype handling."""

from __future__ import annotations

import pytest
import torch

from radixgen.sampling import Sampler, SamplingBatch, SamplingParams


def _batch(B: int, V: int, **kw) -> SamplingBatch:
    return SamplingBatch.build([SamplingParams(**kw)] * B, [[]] * B, list(range(B)), V, [], "cpu")


def test_auto_is_torch_on_cpu():
    assert Sampler("auto", "cpu").backend == "torch"
    assert Sampler().backend == "torch"
    with pytest.raises(ValueError, match="sampling backend"):
        Sampler("flashinfer")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sampler_runs_and_accepts_bf16(backend):
    sampler = Sampler(backend, "cpu")
    logits = torch.randn(3, 50).to(torch.bfloat16)
    out = sampler(logits, _batch(3, 50, temperature=0.7, top_k=5, logprobs=True))
    assert out.next_token_ids.shape == (3,) and out.logprobs.dtype == torch.float32
    greedy = sampler(logits, _batch(3, 50, temperature=0))
    assert torch.equal(greedy.next_token_ids, logits.float().argmax(-1)) and greedy.logprobs is None


def test_boundary_checks():
    sampler = Sampler("torch")
    with pytest.raises(ValueError, match=r"logits must be \[2, V\]"):
        sampler(torch.zeros(3, 10), _batch(2, 10))
    with pytest.raises(ValueError, match="bitmask must be int32"):
        sampler(torch.zeros(2, 10), _batch(2, 10), torch.ones(2, 1, dtype=torch.int64))


def test_greedy_tokens_are_argmax_with_ties_infinities_and_nan():
    """`greedy_tokens` (max's indices, faster on CPU) against torch.argmax: the first of equal
    maxima, rows of -inf, +inf runs and a NaN (which wins, as in argmax), on 1 and 2 threads."""
    from radixgen.sampling.torch_ops import greedy_tokens

    g = torch.Generator().manual_seed(0)
    before = torch.get_num_threads()
    try:
        for trial in range(40):
            x = torch.randint(0, 4, (8, 3000), generator=g).float()  # many ties
            x[0] = float("-inf")
            x[1, 5 + trial] = float("nan")
            x[2, 100 + trial:] = float("inf")
            x[3] = 3.0
            torch.set_num_threads(1 + trial % 2)
            assert torch.equal(greedy_tokens(x), x.argmax(-1)), trial
    finally:
        torch.set_num_threads(before)
