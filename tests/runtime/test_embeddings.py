"""Engine.encode: pooled final hidden states of a decoder model against HF transformers' own
`AutoModel` (its `last_hidden_state` is the final norm's output), on a tiny random llama.

Prompts run batched together, through chunked prefill (mean pooling sums its rows over chunks) and
again from the radix cache; every step checks the KV bookkeeping (`debug_kv_check`) and the KV they
leave is only the tree's, evictable.
"""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.engine import Engine

PROMPTS = ["The quick brown fox jumps over the lazy dog. " * 3, "Hello", "a b c d e f g h i j k l m n o p q r s t u"]


@pytest.fixture(scope="module")
def tiny_engine(tiny_models):
    eng = Engine(model=str(tiny_models["llama"]), context_length=512, max_total_tokens=2048, chunked_prefill_size=16,
                 debug_kv_check=True)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def hf_model(tiny_models):
    import transformers

    return transformers.AutoModel.from_pretrained(str(tiny_models["llama"]), dtype=torch.float32).eval()


def hf_embedding(model, ids: list[int], pooling: str) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0]  # [T, hidden], after the final norm
    pooled = hidden[-1] if pooling == "last" else hidden.mean(0)
    return torch.nn.functional.normalize(pooled, dim=0)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embeddings_equal_hf_pooled_hidden_states(tiny_engine, hf_model, pooling):
    ids = [tiny_engine.tokenizer.encode(p) for p in PROMPTS]
    assert max(map(len, ids)) > 16  # one prompt runs in several chunks
    for _ in range(2):  # the second time the prompts are in the radix cache
        outs = tiny_engine.encode(PROMPTS, pooling=pooling)
        for out, prompt_ids in zip(outs, ids, strict=True):
            got = torch.tensor(out["embedding"])
            want = hf_embedding(hf_model, prompt_ids, pooling)
            assert got.shape == want.shape and abs(float(got.norm()) - 1) < 1e-5
            torch.testing.assert_close(got, want, atol=2e-4, rtol=0)
            assert out["meta_info"]["prompt_tokens"] == len(prompt_ids)
    stats = tiny_engine.get_stats()
    assert stats["running"] == stats["waiting"] == 0 and stats["kv_used"] == stats["kv_evictable"]


def test_encode_takes_token_ids_and_batches_with_generation(tiny_engine, hf_model):
    ids = tiny_engine.tokenizer.encode(PROMPTS[2])
    single = tiny_engine.encode(input_ids=ids)
    torch.testing.assert_close(torch.tensor(single["embedding"]), hf_embedding(hf_model, ids, "last"), atol=2e-4,
                               rtol=0)
    import threading

    gen: list = []
    t = threading.Thread(target=lambda: gen.append(tiny_engine.generate(PROMPTS[0], {"max_new_tokens": 24,
                                                                                     "ignore_eos": True})))
    t.start()
    both = tiny_engine.encode(input_ids=[ids, ids[:5]], pooling="mean")  # alongside a decoding request
    t.join()
    assert gen[0]["meta_info"]["completion_tokens"] == 24
    torch.testing.assert_close(torch.tensor(both[1]["embedding"]), hf_embedding(hf_model, ids[:5], "mean"),
                               atol=2e-4, rtol=0)
    with pytest.raises(ValueError, match="pooling"):
        tiny_engine.encode("x", pooling="cls")
    with pytest.raises(ValueError, match="input_ids"):
        tiny_engine.encode(input_ids=[10**9])
