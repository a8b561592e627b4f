"""Speculative decoding keeps sampling exact: with drafts verified, the first two tokens are
distributed as the target model's (chi-square against HF transformers' probabilities on a tiny
random model, 20,000 draws), and seeded requests give the very tokens they give without drafts."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from radixgen.runtime.engine import Engine
from radixgen.runtime.scheduler.speculator import StepCosts
from tests.conftest import build_tiny_model

TOP_K, TEMPERATURE, DRAWS = 3, 0.8, 20_000


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """A tiny random Llama with a 512-token vocabulary (ids < 512 of the SmolLM2 tokenizer): sampling
    20,000 sequences costs little per row."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny512") / "llama", "llama", vocab_size=512)


@pytest.fixture(scope="module")
def hf_tiny(tiny_path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(tiny_path), dtype=torch.float32).eval()


def target(hf, ids: list[int]) -> dict[int, float]:
    """HF's next-token distribution after temperature and top-k (what the request samples from)."""
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, -1] / TEMPERATURE
    top = logits.topk(TOP_K)
    return dict(zip(top.indices.tolist(), torch.softmax(top.values, -1).tolist(), strict=True))


def copy_prompt(hf) -> tuple[list[int], int]:
    """A prompt ending with a bigram seen earlier in it, whose earlier continuation z is the target's
    likeliest next token (so prompt lookup drafts z, accepted about half the time); returns (prompt, z)."""
    rng = random.Random(0)
    for _ in range(100):
        a, b, w = (rng.randrange(100, 512) for _ in range(3))
        filler = [rng.randrange(100, 512) for _ in range(6)]
        z = rng.randrange(100, 512)
        for _ in range(6):
            prompt = [a, b, z, w, *filler, a, b]
            dist = target(hf, prompt)
            best = max(dist, key=dist.get)
            if best == z and 0.3 < dist[z] < 0.8:
                return prompt, z
            z = best
    raise AssertionError("no prompt found whose lookup draft is the likeliest token")


def test_first_two_tokens_follow_the_target_distribution(tiny_path, hf_tiny):
    prompt, z = copy_prompt(hf_tiny)
    first = target(hf_tiny, prompt)
    expected = {(t1, t2): p1 * p2 for t1, p1 in first.items() for t2, p2 in target(hf_tiny, prompt + [t1]).items()}
    # one thread: the 2-layer model's ops are too small to share, and a busy machine makes their syncs costly
    eng = Engine(model=str(tiny_path), speculative_algorithm="ngram", disable_overlap=True, num_threads=1)
    try:
        # rows cost nothing: every request drafts what lookup proposes
        eng.scheduler.speculator.costs = StepCosts(1e9, learn=False)
        outs = eng.generate(input_ids=prompt, sampling_params={"n": DRAWS, "max_new_tokens": 2, "seed": 7,
                                                                "temperature": TEMPERATURE, "top_k": TOP_K,
                                                                "ignore_eos": True})
        stats = eng.get_stats()
    finally:
        eng.shutdown()
    counts = Counter(tuple(o["output_ids"]) for o in outs)
    assert set(counts) <= set(expected)
    first_counts = Counter(t1 for t1, _ in counts.elements())
    chi_square(counts, expected, "joint (first, second)")
    chi_square(first_counts, first, "first")
    # the drafts were really verified, and accepted and rejected often
    assert stats["spec_num_proposed_drafts"] >= DRAWS
    assert 0.2 < stats["spec_accept_rate"] < 0.8
    assert 0.2 < first_counts[z] / DRAWS < 0.8


def chi_square(counts: Counter, probs: dict, name: str) -> None:
    keys = sorted(probs)
    observed = [counts[k] for k in keys]
    total = sum(probs.values())
    expected = [probs[k] / total * sum(observed) for k in keys]
    result = chisquare(observed, expected)
    assert result.pvalue > 1e-3, f"{name}: observed {observed}, expected {[round(e) for e in expected]} ({result})"
