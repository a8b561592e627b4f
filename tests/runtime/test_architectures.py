"""Architectures beyond Llama against HF transformers: Qwen2 (q/k/v bias) and Qwen3 (q/k norms) from
their GGUF conversion (read by HF's own GGUF loader), Mistral's sliding window from safetensors,
past the window, and Phi-3 (fused checkpoint matrices; LongRoPE's short and long factors) and Gemma 2
(soft-capped attention, windows on alternate layers) from both (Gemma 3: test_gemma3.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.models.llama import layer_matrices
from radixgen.runtime.models.loader import open_checkpoint
from radixgen.runtime.models.sharding import ShardPlan
from radixgen.runtime.tokenizer import load_tokenizer
from tests.conftest import build_tiny_model
from tests.runtime.hf_to_gguf import convert
from tests.runtime.test_model_logits import PROMPT, check_model


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_gguf_matches_hf(tmp_path, arch):
    # HF's GGUF loader takes Qwen3's head_dim as its default (128), not from the file: build it so
    hf_dir = build_tiny_model(tmp_path / arch, arch, **({"head_dim": 128} if arch == "qwen3" else {}))
    path = convert(hf_dir, tmp_path / f"{arch}.gguf", arch)
    check_model(path, load_tokenizer(hf_dir).encode(PROMPT))


def test_mistral_sliding_window_matches_hf(tmp_path):
    path = build_tiny_model(tmp_path / "mistral", "mistral", sliding_window=16)
    ids = load_tokenizer(path).encode(" ".join([PROMPT] * 3))
    assert len(ids) > 3 * 16
    check_model(path, ids)


def test_phi3_matches_hf(tmp_path):
    """Phi-3's fused qkv_proj / gate_up_proj become our fused q/k/v and gate/up matrices as they are."""
    path = build_tiny_model(tmp_path / "phi3", "phi3")
    check_model(path, load_tokenizer(path).encode(PROMPT))


def test_phi3_gguf_matches_hf(tmp_path):
    """Phi-3's GGUF (`attn_qkv`, gate and up in one `ffn_up`) read as blocks, against HF's GGUF loader."""
    hf_dir = build_tiny_model(tmp_path / "phi3", "phi3")
    path = convert(hf_dir, tmp_path / "phi3.gguf", "phi3")
    check_model(path, load_tokenizer(hf_dir).encode(PROMPT))


LONGROPE_ORIGINAL = 64  # the tiny model's pretraining length: contexts past it take the long factors


def longrope_phi3(out) -> Path:
    """A tiny Phi-3 with LongRoPE: distinct random short / long factors per frequency, a 4x context
    extension (attention factor sqrt(1 + ln 4 / ln 64)), so the set used and the factor show in logits."""
    g = torch.Generator().manual_seed(3)
    half = 64 // 4 // 2  # head_dim / 2 of TINY (hidden 64, 4 heads)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": (1 + torch.rand(half, generator=g)).tolist(),
            "long_factor": (2 + 6 * torch.rand(half, generator=g)).tolist()}
    return build_tiny_model(out, "phi3", rope_parameters=rope, original_max_position_embeddings=LONGROPE_ORIGINAL,
                            max_position_embeddings=4 * LONGROPE_ORIGINAL)


def test_phi3_longrope_short_context_matches_hf(tmp_path):
    """Served within the pretraining length, LongRoPE's short factors: HF takes them for any sequence
    no longer than that (here the prompt plus 32 decoded tokens)."""
    path = longrope_phi3(tmp_path / "phi3")
    ids = load_tokenizer(path).encode(PROMPT)
    assert len(ids) + 33 <= LONGROPE_ORIGINAL
    check_model(path, ids, context_length=LONGROPE_ORIGINAL)


def test_phi3_longrope_long_context_matches_hf(tmp_path):
    """Served past the pretraining length, the long factors, on a prompt past it (HF's choice for it):
    from safetensors, and from a Q8_0 GGUF carrying llama.cpp's rope_factors_long / _short tensors (its
    blocks and the one-call C decode) against HF's GGUF loader told the LongRoPE config it does not read."""
    import transformers

    hf_dir = longrope_phi3(tmp_path / "phi3")
    ids = load_tokenizer(hf_dir).encode(" ".join([PROMPT] * 4))
    assert len(ids) > LONGROPE_ORIGINAL
    check_model(hf_dir, ids, context_length=4 * LONGROPE_ORIGINAL)
    path = convert(hf_dir, tmp_path / "phi3.gguf", "phi3")
    cfg = json.loads((hf_dir / "config.json").read_text())
    ours, hf = dict(open_checkpoint(path)[0].rope_scaling), dict(ModelConfig.from_hf(cfg).rope_scaling)
    assert ours.pop("attention_factor") == pytest.approx(hf.pop("attention_factor"), rel=1e-6)  # stored as F32
    assert ours == hf  # the factors are float32 values in both files
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32, rope_parameters=cfg["rope_parameters"],
        original_max_position_embeddings=LONGROPE_ORIGINAL, max_position_embeddings=4 * LONGROPE_ORIGINAL).eval()
    # float32 activations in the block kernel for the prompt too: the check's tolerance is float32's
    check_model(path, ids, ref=ref, context_length=4 * LONGROPE_ORIGINAL, wide_matmul_dtype="float32")


def test_longrope_factors_must_match_the_head():
    cfg = {"architectures": ["Phi3ForCausalLM"], "num_attention_heads": 4, "num_hidden_layers": 2,
           "hidden_size": 64, "intermediate_size": 128, "vocab_size": 100,
           "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}}
    with pytest.raises(ValueError, match="head_dim / 2 = 8"):
        ModelConfig.from_hf(cfg)


def test_gemma2_matches_hf_past_the_window(tmp_path):
    """Soft-capped attention scores on every layer, a 16-token window on every other one, past it."""
    path = build_tiny_model(tmp_path / "gemma2", "gemma2")
    ids = load_tokenizer(path).encode(" ".join([PROMPT] * 3))
    assert len(ids) > 3 * 16
    check_model(path, ids)


def test_gemma2_gguf_matches_hf_gguf_loader(tmp_path):
    """Gemma 2's GGUF as llama.cpp's converter writes it (1 + w norms, window and soft-caps in the
    metadata). HF's GGUF loader reads neither soft-cap nor query_pre_attn_scalar from the file (it takes
    Gemma2Config's defaults: caps 50 and 30, scalar 256, where llama.cpp scales by head_dim), so the
    model is built with those values and a head_dim of 256; the caps we read from the file are checked."""
    hf_dir = build_tiny_model(tmp_path / "gemma2", "gemma2", head_dim=256, query_pre_attn_scalar=256,
                              attn_logit_softcapping=50.0)
    path = convert(hf_dir, tmp_path / "gemma2.gguf", "gemma2")
    config, _ = open_checkpoint(path)
    assert (config.attn_logit_softcap, config.final_logit_softcap, config.sliding_layers) == (50.0, 30.0,
                                                                                             (True, False))
    check_model(path, load_tokenizer(hf_dir).encode(" ".join([PROMPT] * 3)))


def test_phi3_fused_tensors_split_by_tp_rank():
    """Under tensor parallelism each rank reads its rows of each part of Phi-3's fused tensors: the same
    rows it reads of separate q/k/v (gate/up) matrices."""
    c = ModelConfig(arch="phi3", vocab_size=8, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=16)
    qkv, gate_up = torch.arange(64 + 2 * 32), torch.arange(2 * 128)  # row ids of qkv_proj, gate_up_proj
    q, k, v = qkv.split([64, 32, 32])
    gate, up = gate_up.split([128, 128])
    for rank in range(2):
        plan = ShardPlan(c, rank, 2)
        parts = layer_matrices(plan, 0)
        assert {n for n, _, _ in parts["qkv"]} == {"self_attn.qkv_proj"}
        assert torch.cat([qkv[r] for _, r, _ in parts["qkv"]]).tolist() == torch.cat(
            [q[plan.q_rows()], k[plan.kv_rows()], v[plan.kv_rows()]]).tolist()
        assert torch.cat([gate_up[r] for _, r, _ in parts["mlp.gate_up"]]).tolist() == torch.cat(
            [gate[plan.mlp_rows()], up[plan.mlp_rows()]]).tolist()
