"""Our model's logits vs HF transformers' on the same weights (float32, max abs diff <= 2e-3)."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.forward_batch import make_forward_batch
from radixgen.runtime.executor.model_runner import ModelRunner

ATOL = 2e-3


def hf_model(path):
    import transformers

    if str(path).endswith(".gguf"):
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


class Seq:
    """One sequence driven through the runner's pools by hand."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.slot = runner.req_to_token_pool.alloc()
        self.len = 0

    def extend(self, tokens: list[int], all_logits: bool = False) -> torch.Tensor:
        loc = self.runner.token_to_kv_pool.alloc(len(tokens))
        pool = self.runner.req_to_token_pool
        pool.write(self.slot, self.len, loc)
        rows = [list(range(len(tokens)))] if all_logits else None
        fb = make_forward_batch([tokens], [self.len], [self.slot], loc, rows, table_update=pool.take_updates())
        self.len += len(tokens)
        return self.runner.forward(fb)


def check_model(path, prompt_ids: list[int], attention_backend: str = "torch", ref: torch.nn.Module | None = None,
                **config_fields) -> None:
    """Our logits on `path` vs HF's (`ref`, default: HF's own load of `path`): a prefill, a split one and
    32 greedy decode steps."""
    config = EngineConfig(model=str(path), max_total_tokens=4096, max_running_requests=4,
                          attention_backend=attention_backend, **config_fields)
    runner = ModelRunner(config)
    ref = hf_model(path) if ref is None else ref
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        ref_logits = ref(ids).logits[0].float()  # [T, V]
    # full prefill
    full = Seq(runner).extend(prompt_ids, all_logits=True)
    assert (full - ref_logits).abs().max().item() <= ATOL
    # a prefill wanting the last token's logits only (its last layer computes that row alone)
    assert (Seq(runner).extend(prompt_ids) - ref_logits[-1:]).abs().max().item() <= ATOL
    # prefill split in two extends (prefix, then suffix attending to the cached prefix)
    split = len(prompt_ids) // 3
    s = Seq(runner)
    s.extend(prompt_ids[:split])
    tail = s.extend(prompt_ids[split:], all_logits=True)
    assert (tail - ref_logits[split:]).abs().max().item() <= ATOL
    # 32 greedy decode steps, each compared with HF on the whole sequence so far
    seq = list(prompt_ids)
    last = tail[-1]
    with torch.no_grad():
        for _ in range(32):
            nxt = int(last.argmax())
            seq.append(nxt)
            last = s.extend([nxt])[0]
        ref_all = ref(torch.tensor([seq])).logits[0].float()
    # compare the final decode step's logits and the greedy path
    assert (last - ref_all[-1]).abs().max().item() <= ATOL
    assert seq[len(prompt_ids) + 1 :] == ref_all[len(prompt_ids) : -1].argmax(-1).tolist()


PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_models_match_hf(tiny_models, arch):
    from radixgen.runtime.tokenizer import load_tokenizer

    ids = load_tokenizer(tiny_models[arch]).encode(PROMPT)
    check_model(tiny_models[arch], ids)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_models_match_hf_with_triton_attention(tiny_models, arch):
    """The Triton kernels (interpreted on CPU) inside the whole model, against HF."""
    from radixgen.runtime.tokenizer import load_tokenizer

    ids = load_tokenizer(tiny_models[arch]).encode(PROMPT)
    check_model(tiny_models[arch], ids, attention_backend="triton")


def test_smollm2_gguf_matches_hf(smollm2_path):
    from radixgen.runtime.tokenizer import load_tokenizer

    check_model(smollm2_path, load_tokenizer().encode(PROMPT))
