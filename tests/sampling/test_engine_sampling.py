"""Sampling inside the engine: seeds reproducible whatever the batch, n > 1 shares the prompt's KV."""

from __future__ import annotations


def test_seeded_output_same_alone_and_in_mixed_batch(engine):
    target = ("Write a short poem about autumn:", {"temperature": 0.9, "top_p": 0.95, "seed": 1234,
                                                   "max_new_tokens": 20, "ignore_eos": True})
    alone = engine.generate(*target)["output_ids"]
    others = [
        (f"Prompt number {i} says", {"temperature": 0.7 + 0.05 * i, "top_k": 20 + i, "max_new_tokens": 5 + i,
                                     "seed": i, "frequency_penalty": 0.1 * (i % 3)})
        for i in range(15)
    ]
    mixed = others[:7] + [target] + others[7:]
    results = engine.generate([p for p, _ in mixed], [s for _, s in mixed])
    assert results[7]["output_ids"] == alone
    again = engine.generate(*target)["output_ids"]
    assert again == alone


def test_different_seeds_differ(engine):
    p = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True}
    outs = {tuple(engine.generate("Tell me something:", dict(p, seed=s))["output_ids"]) for s in range(4)}
    assert len(outs) > 1


def test_n_completions_share_one_prefill(engine):
    prompt = "List three animals that live in the ocean and describe each one briefly:"
    n_prompt = len(engine.tokenizer.encode(prompt))
    engine.flush_cache()
    before = engine.get_stats()["prompt_tokens"]
    outs = engine.generate(prompt, {"temperature": 1.0, "n": 4, "seed": 7, "max_new_tokens": 8, "ignore_eos": True})
    after = engine.get_stats()["prompt_tokens"]
    assert len(outs) == 4
    assert all(o["meta_info"]["cached_tokens"] == n_prompt - 1 for o in outs)
    assert after - before == n_prompt + 4  # one full prefill, then one token each
    assert len({tuple(o["output_ids"]) for o in outs}) > 1


def test_penalties_and_bias_change_greedy_output(engine):
    base = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    plain = engine.generate("one one one one one", base)["output_ids"]
    first = plain[0]
    banned = engine.generate("one one one one one", dict(base, logit_bias={first: -100.0}))["output_ids"]
    assert banned[0] != first
    rep = engine.generate("one one one one one", dict(base, repetition_penalty=2.0))["output_ids"]
    assert len(set(rep)) >= len(set(plain))
