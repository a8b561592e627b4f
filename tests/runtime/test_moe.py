"""Qwen3-MoE against HF transformers (the oracle): logits from safetensors and from a GGUF conversion
(stacked expert tensors, read one expert at a time as block weights), the router's choice of experts,
and a decode step that runs only its token's chosen experts. Tensor parallelism (every expert on
every rank, over its half of the expert width) against one rank, itself checked against HF here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.layers.linear import BlockLinear
from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.models.llama import layer_matrices
from radixgen.runtime.models.moe import MoEMLP
from radixgen.runtime.models.sharding import ShardPlan, check_tp_size
from tests.conftest import build_tiny_model
from tests.runtime.hf_to_gguf import convert
from tests.runtime.test_model_logits import PROMPT, Seq, check_model, hf_model
from tests.runtime.test_tp_logits import TOL, Driver, drive_mixed_steps


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
    Seq(r).extend(prompt_ids, all_logits=True)  # every row through every layer (else the last takes one row)
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


@pytest.fixture(scope="module", params=["safetensors", "gguf"])
def tp_runners(request, moe_dir, moe_gguf):
    """A tp=1 and a tp=2 runner of the same checkpoint. From the GGUF both run dense dequantized
    matrices (the tp=2 ranks always do), so they differ only by the split."""
    path = moe_dir if request.param == "safetensors" else moe_gguf
    common = dict(model=str(path), max_total_tokens=1024, max_running_requests=4, context_length=512)
    ref = ModelRunner(EngineConfig(**common, disable_block_kernels=True))
    from radixgen.runtime.distributed.runner import TPModelRunner

    tp = TPModelRunner(EngineConfig(**common, tp_size=2))
    yield ref, tp
    tp.close()


def test_tp2_logits_equal_tp1(tp_runners):
    """Prefill, chunked prefill beside decodes, a shared prefix and decode steps: tp=2 gives tp=1's
    logits, so both ranks route every token to the same experts and their halves sum to the layer."""
    ref, tp = tp_runners
    d = Driver(ref, tp)
    drive_mixed_steps(d)
    assert d.max_diff < TOL, f"tp=2 logits differ from tp=1 by {d.max_diff}"


def test_each_rank_holds_half_of_each_expert(tp_runners, monkeypatch):
    """Rank 0 holds every expert over half its width (which half each rank holds:
    test_expert_slices_cover_the_width) and the whole router; a step all-reduces each MoE layer's
    output once, not once per expert."""
    ref, tp = tp_runners
    size = lambda m: m.in_features * m.out_features  # noqa: E731 (any weight representation)
    for ours, full in zip(moe_layers(tp), moe_layers(ref), strict=True):
        assert size(ours.router) == size(full.router)
        assert len(ours.experts) == len(full.experts) == 8
        for e, f in zip(ours.experts, full.experts, strict=True):
            assert (2 * e.gate_up.out_features, 2 * e.down.in_features) == (f.gate_up.out_features, f.down.in_features)
            assert 2 * (size(e.gate_up) + size(e.down)) == size(f.gate_up) + size(f.down)
    comm, reduced = tp.model.tp.comm, []
    monkeypatch.setattr(comm, "all_reduce", lambda t, inner=comm.all_reduce: reduced.append(t.shape) or inner(t))
    Driver(ref, tp).step({3: [5, 6, 7]})
    assert len(reduced) == 1 + 2 * tp.model.config.num_layers  # the embedding, then o_proj and the MoE per layer


def test_expert_slices_cover_the_width(moe_dir):
    """Rank r of 2 holds rows r*16 .. of each expert's gate_proj and up_proj, the same columns of its
    down_proj, and the whole router."""
    config = ModelConfig.from_hf(json.loads((moe_dir / "config.json").read_text()))
    for rank in range(2):
        parts = layer_matrices(ShardPlan(config, rank, 2), 0)
        inner = slice(16 * rank, 16 * (rank + 1))
        assert parts["mlp.router"] == [("mlp.gate", None, None)]
        assert parts["mlp.experts.7.gate_up"] == [("mlp.experts.7.gate_proj", inner, None),
                                                  ("mlp.experts.7.up_proj", inner, None)]
        assert parts["mlp.experts.7.down"] == [("mlp.experts.7.down_proj", None, inner)]


def test_tp_size_must_divide_the_expert_width(moe_dir):
    """A tp size that does not divide moe_intermediate_size is refused, naming it and the sizes that
    work; the dense MLP width counts only where some layer is dense."""
    cfg = json.loads((moe_dir / "config.json").read_text())  # 4 query heads, 2 KV heads
    narrow = ModelConfig.from_hf(cfg | {"moe_intermediate_size": 30})
    check_tp_size(narrow, 2)
    with pytest.raises(ValueError, match=r"tp_size=4 does not divide this model's expert MLP width "
                                         r"\(moe_intermediate_size\) of 30; tp sizes that work for it: \[1, 2\]"):
        check_tp_size(narrow, 4)
    check_tp_size(ModelConfig.from_hf(cfg | {"intermediate_size": 102}), 4)  # no dense layer
    with pytest.raises(ValueError, match=r"MLP width \(intermediate_size\) of 102"):
        check_tp_size(ModelConfig.from_hf(cfg | {"intermediate_size": 102, "mlp_only_layers": [1]}), 4)
