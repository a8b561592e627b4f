"""A tiny HF model written as a GGUF file the way llama.cpp's converter names and lays it out, with
`gguf`'s own writer, for tests that load the file in radixgen and in HF transformers' GGUF loader.

Matrices are quantized with gguf-py (`qtype`), norms and biases stay F32; the vocabulary is made-up
tokens (the logits are compared on token ids). Only what the tests' architectures need is written.
phi3 keeps its fused `qkv_proj` / `gate_up_proj` as `attn_qkv` / `ffn_up` (LongRoPE: its factor tensors
and keys); gemma2's norms are named as Gemma's (`post_attention_norm`, `ffn_norm` before the MLP,
`post_ffw_norm`) and get +1 (HF's are 1 + w).
qwen3moe: each layer's experts stacked into `ffn_{gate,up,down}_exps` [n_expert, rows, cols] as
llama.cpp's converter writes them, the router (`ffn_gate_inp`) kept F32 as llama.cpp's quantizer does.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
               "mlp.gate": "ffn_gate_inp"}
TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
ARCH_LAYER_NAMES = {  # where an architecture's layer tensor names differ from LAYER_NAMES
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
    "gemma2": {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"},
}
EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    base, _, suffix = hf_name.rpartition(".")
    if base.startswith("rope_factors_"):
        return hf_name
    if base in TOP_NAMES:
        return f"{TOP_NAMES[base]}.{suffix}"
    _, _, layer, rest = base.split(".", 3)  # model.layers.N.<rest>
    return f"blk.{layer}.{ARCH_LAYER_NAMES.get(arch, {}).get(rest) or LAYER_NAMES[rest]}.{suffix}"


def stack_experts(tensors: dict[str, np.ndarray], arch: str) -> dict[str, np.ndarray]:
    """Per-expert HF matrices replaced by one stacked [n_expert, rows, cols] tensor per layer and kind,
    under llama.cpp's names (`blk.N.ffn_gate_exps.weight`); other tensors under their GGUF names."""
    out, experts = {}, {}
    for name, t in tensors.items():
        m = EXPERT.fullmatch(name)
        if m is None:
            out[gguf_name(name, arch)] = t
        else:
            experts.setdefault(f"blk.{m[1]}.ffn_{m[3]}_exps.weight", {})[int(m[2])] = t
    for name, parts in experts.items():
        out[name] = np.stack([parts[e] for e in range(len(parts))])
    return out


def convert(hf_dir: Path, out: Path, arch: str, qtype: str = "Q8_0") -> Path:
    """Write the HF model in `hf_dir` (qwen2, qwen3 or qwen3moe) as GGUF `out`, matrices in `qtype`."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    tensors = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(f))
    heads, vocab = cfg["num_attention_heads"], cfg["vocab_size"]
    writer = gguf.GGUFWriter(out, arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 1e4)))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"<{i}>" for i in range(vocab)])
    writer.add_token_types([gguf.TokenType.NORMAL] * vocab)
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    if arch == "gemma2":
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        tensors = {n: t + 1 if n.endswith("norm.weight") else t for n, t in tensors.items()}
    rope = cfg.get("rope_parameters") or {}
    if arch == "phi3" and rope.get("rope_type") == "longrope":  # as llama.cpp's Phi3MiniModel writes it
        original = cfg["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        writer.add_rope_scaling_orig_ctx_len(original)
        tensors["rope_factors_long.weight"] = np.array(rope["long_factor"], dtype=np.float32)
        tensors["rope_factors_short.weight"] = np.array(rope["short_factor"], dtype=np.float32)
    if arch == "qwen3moe":
        writer.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    kind = gguf.GGMLQuantizationType[qtype]
    for name, t in stack_experts(tensors, arch).items():
        t = t.astype(np.float32)
        if t.ndim >= 2 and qtype != "F32" and ".ffn_gate_inp." not in name:
            writer.add_tensor(name, gguf.quants.quantize(t, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
