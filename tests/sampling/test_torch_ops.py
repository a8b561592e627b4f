"""torch_ops pieces against hand computations: bitmask, bias, penalties, min-new-tokens ban, the
counter-based RNG, and SamplingBatch.build. Penalty / bias checks run on both sampling paths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from radixgen.sampling import SamplingBatch, SamplingParams, apply_token_bitmask_, counter_uniform
from radixgen.sampling.torch_ops import process_logits, token_counts


def test_apply_token_bitmask_matches_bit_layout(pack_bitmask):
    V = 70  # not a multiple of 32: the last word is partial
    gen = torch.Generator().manual_seed(0)
    allowed = [sorted(torch.randperm(V, generator=gen)[: n].tolist()) for n in (1, 5, 33, 70)]
    logits = torch.randn(4, V, generator=gen)
    out = apply_token_bitmask_(logits.clone(), pack_bitmask(allowed, V))
    for r, toks in enumerate(allowed):
        finite = torch.isfinite(out[r]).nonzero().flatten().tolist()
        assert finite == toks
        assert torch.equal(out[r, toks], logits[r, toks])
    with pytest.raises(ValueError, match="bitmask must be int32"):
        apply_token_bitmask_(logits.clone(), torch.zeros(4, 2, dtype=torch.int32))


def test_bit_31_and_full_words(pack_bitmask):
    V = 64
    out = apply_token_bitmask_(torch.zeros(2, V), pack_bitmask([[31, 63], list(range(V))], V))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [31, 63]
    assert torch.isfinite(out[1]).all()


# logits, bias, output ids and penalties with a hand-computed result (see the comments).
HAND_LOGITS = [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]
HAND_PARAMS = dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                   logit_bias={0: 0.5, 2: 1.5, 5: -10.0})
HAND_OUTPUT = [0, 0, 1, 3]  # counts: token0 x2, token1 x1, token3 x1
# token0: (2.0 + 0.5) / 2 - 0.5 * 2 - 0.25 = 0.0     token1: -1.0 * 2 - 0.5 - 0.25 = -2.75
# token2: 0.5 + 1.5 = 2.0 (unseen)                    token3: 3.0 / 2 - 0.5 - 0.25 = 0.75
# token4: -2.0 (untouched)                            token5: 1.0 - 10.0 = -9.0
HAND_RESULT = [0.0, -2.75, 2.0, 0.75, -2.0, -9.0]


def test_penalties_and_bias_reference():
    batch = SamplingBatch.build([SamplingParams(**HAND_PARAMS)], [HAND_OUTPUT], [0], 6, [], "cpu")
    out = process_logits(torch.tensor([HAND_LOGITS]), batch)
    assert torch.allclose(out, torch.tensor([HAND_RESULT]))


def test_penalties_and_bias_both_paths(sample_fn):
    params = SamplingParams(**HAND_PARAMS, temperature=0, logprobs=True, top_logprobs=6)
    batch = SamplingBatch.build([params], [HAND_OUTPUT], [0], 6, [], "cpu")
    out = sample_fn(torch.tensor([HAND_LOGITS]), batch)
    expect = torch.log_softmax(torch.tensor(HAND_RESULT), -1)
    assert out.next_token_ids.tolist() == [2]
    assert out.logprobs.item() == pytest.approx(expect[2].item(), abs=1e-5)
    assert out.top_logprob_ids[0].tolist() == torch.argsort(expect, descending=True).tolist()
    assert torch.allclose(out.top_logprob_values[0], expect.sort(descending=True).values, atol=1e-5)


def test_min_new_tokens_bans_eos_and_stop_ids(sample_fn):
    V, eos, stop = 8, 7, 6
    logits = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 5.0, 9.0]]).repeat(3, 1)
    params = [SamplingParams(temperature=0, min_new_tokens=3, stop_token_ids=[stop]),
              SamplingParams(temperature=0, min_new_tokens=3, stop_token_ids=[stop], ignore_eos=True),
              SamplingParams(temperature=0, min_new_tokens=3, stop_token_ids=[stop])]
    batch = SamplingBatch.build(params, [[1], [1], [1, 2, 3]], [0, 0, 0], V, [eos], "cpu")
    assert sorted(batch.min_tokens_ban.tolist()) == [6, 7, V + 6]
    assert sample_fn(logits, batch).next_token_ids.tolist() == [1, eos, eos]


def test_token_counts_scatter():
    counts = token_counts([[1, 1, 3], [], [0, 4, 4, 4]], 5, "cpu")
    assert counts.dtype == torch.int32
    assert counts.tolist() == [[0, 2, 0, 1, 0], [0] * 5, [1, 0, 0, 0, 3]]


def test_build_normalises_and_skips_unneeded_tensors():
    V = 50
    params = [SamplingParams(temperature=0.5), SamplingParams(temperature=0.9, top_k=1, top_p=0.5),
              SamplingParams(top_k=100), SamplingParams(seed=1 << 70)]
    batch = SamplingBatch.build(params, [[], [1], [1, 2], []], [3, 4, 5, -1], V, [2], "cpu")
    assert batch.temperatures.tolist() == pytest.approx([0.5, 0.0, 1.0, 1.0])
    assert batch.top_ks.tolist() == [V, V, V, V] and batch.top_ps.tolist() == [1.0] * 4
    assert batch.steps.tolist() == [0, 1, 2, 0] and batch.seeds.min().item() >= 0
    assert not (batch.need_top_k or batch.need_top_p or batch.need_min_p or batch.need_penalties)
    assert batch.output_counts is None and batch.logit_bias is None and batch.min_tokens_ban is None
    assert batch.repetition_penalties is None and not batch.all_greedy and not batch.need_logprobs
    assert batch.greedy_rows.tolist() == [False, True, False, False]
    greedy = SamplingBatch.build([SamplingParams(temperature=0, top_logprobs=3)] * 2, [[], []], [0, 0], V, [], "cpu")
    assert greedy.all_greedy and greedy.need_logprobs and greedy.max_top_logprobs == 3


def test_counter_uniform_is_uniform_and_keyed():
    n = 100_000
    ar = torch.arange(n, dtype=torch.int64)
    by_seed = counter_uniform(ar, torch.zeros(n, dtype=torch.int64))
    by_step = counter_uniform(torch.full((n,), 1234, dtype=torch.int64), ar)
    big_seed = counter_uniform(ar + (1 << 40), torch.full((n,), 7, dtype=torch.int64))
    for u in (by_seed, by_step, big_seed):
        assert u.dtype == torch.float32 and 0 < u.min().item() and u.max().item() < 1
        assert stats.kstest(u.double().numpy(), "uniform").pvalue > 1e-3
    lag = by_step.double().numpy()
    assert abs(np.corrcoef(lag[:-1], lag[1:])[0, 1]) < 4 / math.sqrt(n)  # consecutive steps uncorrelated
    assert torch.equal(counter_uniform(ar[:10], ar[:10]), counter_uniform(ar[:10], ar[:10]))
    assert not torch.equal(by_seed[:10], big_seed[:10])


def test_inverse_cdf_edges():
    from radixgen.sampling.torch_ops import inverse_cdf

    w = torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0]] * 3)
    u = torch.tensor([1e-7, 0.5, 1.0])  # u == 1 (outside the RNG's range) lands past the end
    assert inverse_cdf(w.clone(), u).tolist() == [1, 3, 3]
