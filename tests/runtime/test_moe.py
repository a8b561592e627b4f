"""Qwen3-MoE against HF transformers (the oracle): logits from safetensors and from a GGUF conversion
(stacked expert tensors, read one expert at a time as block weights), the router's choice of experts,
and a decode step that runs only its token's chosen experts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.layers.linear import BlockLinear
from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.models.moe import MoEMLP
from radixgen.runtime.models.sharding import check_tp_size
from tests.conftest import build_tiny_model
from tests.runtime.hf_to_gguf import convert
from tests.runtime.test_model_logits import PROMPT, Seq, check_model, hf_model


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("moe") / "qwen3moe", "qwen3moe")


@pytest.fixture(scope="module")
def moe_gguf(moe_dir, tmp_path_factory) -> Path:
    return convert(moe_dir, tmp_path_factory.mktemp("moe_gguf") / "qwen3moe-q8_0.gguf", "qwen3moe")


@pytest.fixture(scope="module")
def prompt_ids(moe_dir) -> list[int]:
    from radixgen.runtime.tokenizer import load_tokenizer

    return load_tokenizer(moe_dir).encode(PROMPT)


def runner(path: Path) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(path), max_total_tokens=1024, max_running_requests=2))


def moe_layers(r: ModelRunner) -> list[MoEMLP]:
    layers = [layer.mlp for layer in r.model.layers]
    assert all(isinstance(m, MoEMLP) for m in layers)
    return layers


def test_qwen3moe_matches_hf(moe_dir, prompt_ids):
    check_model(moe_dir, prompt_ids)


def test_qwen3moe_gguf_matches_hf_gguf_loader(moe_gguf, moe_dir, prompt_ids):
    """The Q8_0 GGUF (experts on their blocks) against HF's own GGUF loader, which does not read
    `qwen3moe.expert_feed_forward_length` (it keeps Qwen3MoeConfig's default of 768): we pass the width."""
    import transformers

    r = runner(moe_gguf)
    assert r.model.config.moe_intermediate_size == 32 and r.model.config.norm_topk_prob
    expert = moe_layers(r)[0].experts[3]
    assert isinstance(expert.gate_up, BlockLinear) and isinstance(expert.down, BlockLinear)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(moe_gguf.parent), gguf_file=moe_gguf.name, dtype=torch.float32, moe_intermediate_size=32
    ).eval()
    assert ref.config.norm_topk_prob and ref.config.num_experts == 8
    check_model(moe_gguf, prompt_ids, ref=ref)


def test_routing_matches_hf(moe_dir, prompt_ids):
    """The same experts per token and layer as HF's Qwen3MoeSparseMoeBlock gate: on HF's own inputs to
    each gate, and along each model's own forward pass."""
    ref = hf_model(moe_dir)
    hf_in, hf_chosen = [], []

    def record(gate: torch.nn.Module, args: tuple, out: tuple) -> None:
        hf_in.append(args[0])  # [T, hidden]
        hf_chosen.append(out[2])  # [T, k] the chosen experts (out: logits, weights, indices)

    hooks = [layer.mlp.gate.register_forward_hook(record) for layer in ref.model.layers]
    with torch.no_grad():
        ref(torch.tensor([prompt_ids]))
    for h in hooks:
        h.remove()
    r = runner(moe_dir)
    ours_chosen = []
    for layer, x, chosen in zip(moe_layers(r), hf_in, hf_chosen, strict=True):
        _, ours = layer.route(x)  # [T, k]
        assert torch.equal(ours, chosen)
        layer.register_forward_pre_hook(lambda m, args: ours_chosen.append(m.route(args[0])[1]))
    Seq(r).extend(prompt_ids)
    for ours, chosen in zip(ours_chosen, hf_chosen, strict=True):
        assert torch.equal(ours, chosen)
    assert len({tuple(c) for chosen in hf_chosen for c in chosen.tolist()}) > 3  # routes differ between tokens


def test_decode_runs_only_chosen_experts(moe_gguf, prompt_ids):
    """A decode step runs each chosen expert of its token once, and no other expert."""
    r = runner(moe_gguf)
    layers = moe_layers(r)
    s = Seq(r)
    nxt = int(s.extend(prompt_ids)[-1].argmax())
    chosen: list[set[int]] = [set() for _ in layers]
    ran: list[list[int]] = [[] for _ in layers]
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, args, i=i: chosen[i].update(m.route(args[0])[1].flatten().tolist()))
        for e, expert in enumerate(layer.experts):
            expert.register_forward_hook(lambda m, args, out, i=i, e=e: ran[i].append(e))
    s.extend([nxt])
    for i, layer in enumerate(layers):
        assert len(chosen[i]) == layer.top_k
        assert sorted(ran[i]) == sorted(chosen[i])


def test_sparse_layers_follow_hf_rule(moe_dir):
    """Which layers are sparse: HF Qwen3-MoE's decoder_sparse_step and mlp_only_layers."""
    cfg = json.loads((moe_dir / "config.json").read_text())
    c = ModelConfig.from_hf(cfg | {"num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob) == (8, 2, 32, True)
    assert [c.is_moe(i) for i in range(6)] == [False, True, False, False, False, True]


def test_tensor_parallel_refuses_moe(moe_dir):
    config = ModelConfig.from_hf(json.loads((moe_dir / "config.json").read_text()))
    with pytest.raises(ValueError, match="mixture-of-experts"):
        check_tp_size(config, 2)
    check_tp_size(config, 1)
