"""A 16-bit KV cache (`kv_cache_dtype`) on SmolLM2 against HF transformers' float32 model: logits
within the tolerance docs/architecture.md states for each KV dtype, and the same greedy path, through
prefill (SDPA over the cache's K/V), a split prefill and 32 one-call C decode steps; and the
config's checks."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.kernels import ffi
from tests.runtime.test_model_logits import PROMPT, Seq

# max |logit - HF logit| on PROMPT (measured: bfloat16 0.17, float16 0.015; float32 7e-5)
KV_LOGIT_TOLERANCE = {"bfloat16": 0.25, "float16": 0.03}


@pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the kernels")
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float16"])
def test_16bit_kv_cache_matches_hf_within_tolerance(smollm2_path, hf_smollm2, kv_dtype):
    from radixgen.runtime.tokenizer import load_tokenizer

    ids = load_tokenizer().encode(PROMPT)
    runner = ModelRunner(EngineConfig(model=str(smollm2_path), max_total_tokens=2048, max_running_requests=4,
                                      kv_cache_dtype=kv_dtype))
    assert runner.token_to_kv_pool.k_buffer[0].dtype == getattr(torch, kv_dtype)
    assert runner.model.decode_in_c is not None  # decode steps read the 16-bit cache in C
    tol = KV_LOGIT_TOLERANCE[kv_dtype]
    with torch.no_grad():
        ref = hf_smollm2(torch.tensor([ids])).logits[0].float()  # [T, V]
    assert (Seq(runner).extend(ids, all_logits=True) - ref).abs().max().item() <= tol
    split = len(ids) // 3
    seq = Seq(runner)
    seq.extend(ids[:split])
    tail = seq.extend(ids[split:], all_logits=True)
    assert (tail - ref[split:]).abs().max().item() <= tol
    tokens, last, decoded = list(ids), tail[-1], []
    for _ in range(32):
        tokens.append(int(last.argmax()))
        last = seq.extend(tokens[-1:])[0]
        decoded.append(last)
    with torch.no_grad():
        ref_all = hf_smollm2(torch.tensor([tokens])).logits[0].float()
    assert (torch.stack(decoded) - ref_all[len(ids) :]).abs().max().item() <= tol
    assert tokens[len(ids) + 1 :] == ref_all[len(ids) : -1].argmax(-1).tolist()


def test_kv_cache_dtype_is_checked():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype='auto' on GPU"):
        ModelRunner(EngineConfig(device="cuda", kv_cache_dtype="bfloat16"))
