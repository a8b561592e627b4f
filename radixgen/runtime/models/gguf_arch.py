"""What each GGUF architecture means for us: its ModelConfig from the file's metadata and its tensor
names in HF's naming.

GGUF stores facts an HF config.json holds under `<arch>.*` keys, and leaves some to the loader
that knows the architecture (llama.cpp's `models/gemma3.cpp`): unless the file says otherwise
(`attention.sliding_window_pattern`, `rope.freq_base_swa`), Gemma 3's sliding-window layers are every
layer but each sixth, with a rotary base of 10000, and its query scale is head_dim ** -0.5 except on
the 27B model. Names differ by architecture too: `ffn_norm` is the norm before the MLP,
which HF calls `post_attention_layernorm` in Llama and `pre_feedforward_layernorm` in Gemma (where
`post_attention_layernorm` is the norm on the attention's output). llama.cpp's converter adds 1 to
Gemma's norm weights (HF computes x * (1 + w)), so from GGUF they multiply as they are.
Gemma 2 (`models/gemma2-iswa.cpp`) is Gemma 3 without q/k norms or a local rotary base: every other
layer is windowed (the first one included), and `attn_logit_softcapping` caps its attention scores.
Phi-3 holds q/k/v in one `attn_qkv` and gate/up in one `ffn_up` (gate first), HF's `qkv_proj` and
`gate_up_proj`; llama.cpp ignores its `attention.sliding_window` (Phi SWA is off there), and so do we.
Its 128k variants' LongRoPE is two F32 tensors (`rope_factors_long` / `_short`, the per-frequency
divisors) and `rope.scaling.original_context_length` / `.attn_factor`.
Qwen3-MoE (llama.cpp's `models/qwen3moe.cpp`): every layer's MLP is a mixture of experts whose top-k
weights are renormalized; each layer's experts are stacked in one tensor per matrix
(`ffn_gate_exps` [n_expert, n_ff_exp, n_embd] ...), named here `mlp.experts.gate_proj` etc. (no
expert index: the loader reads expert E of it as HF's `mlp.experts.E.gate_proj`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixgen.runtime.models.config import GEMMA, GEMMA_SWA_PATTERN, ModelConfig, longrope_scaling
from radixgen.runtime.models.gguf_file import GGUFHeader

_COMMON_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp scales the 27B models' queries by hidden / heads
GEMMA3_LOCAL_ROPE_BASE = 10000.0


@dataclass(frozen=True)
class GGUFArch:
    """One GGUF architecture: its name in our ModelConfig, layer tensor names, and whether its q/k
    rows are stored permuted for llama.cpp's interleaved rotary (llama's converter does that)."""

    arch: str
    layer_names: dict[str, str] = field(default_factory=dict)
    permuted_qk: bool = False

    def hf_name(self, gguf_name: str) -> str:
        """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight` (ValueError if unknown)."""
        base, _, suffix = gguf_name.rpartition(".")
        parts = base.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in self.layer_names:
            return f"model.layers.{parts[1]}.{self.layer_names[parts[2]]}.{suffix}"
        if base in TOP_NAMES:
            return f"{TOP_NAMES[base]}.{suffix}"
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for architecture {self.arch!r}")


_LLAMA_NAMES = {**_COMMON_LAYER_NAMES, "ffn_norm": "post_attention_layernorm"}
_GEMMA_NAMES = {**_COMMON_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_MOE_NAMES = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj",
              "ffn_up_exps": "mlp.experts.up_proj", "ffn_down_exps": "mlp.experts.down_proj"}
ARCHS = {
    "llama": GGUFArch("llama", _LLAMA_NAMES, permuted_qk=True),
    "qwen2": GGUFArch("qwen2", _LLAMA_NAMES),
    "qwen3": GGUFArch("qwen3", _LLAMA_NAMES),
    "qwen3moe": GGUFArch("qwen3moe", {**_LLAMA_NAMES, **_MOE_NAMES}),
    "phi3": GGUFArch("phi3", {**_LLAMA_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}),
    "gemma2": GGUFArch("gemma2", _GEMMA_NAMES),
    "gemma3": GGUFArch("gemma3", _GEMMA_NAMES),
}
# read into the config, not weights: llama 3.1+'s rotary factors, Phi-3 128k's LongRoPE factors
EXTRA_TENSORS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}


def gguf_arch(reader: GGUFHeader) -> GGUFArch:
    """The file's architecture (ValueError naming the supported ones)."""
    name = reader.get("general.architecture")
    if name not in ARCHS:
        raise ValueError(f"unsupported GGUF architecture {name!r}: radixgen loads GGUF files of "
                         f"{', '.join(repr(a) for a in ARCHS)}")
    return ARCHS[name]


def gguf_config(reader: GGUFHeader, extra: dict[str, tuple[float, ...]] | None = None) -> ModelConfig:
    """The ModelConfig of a GGUF file's metadata (`extra`: the values of its EXTRA_TENSORS, by name)."""
    arch = gguf_arch(reader).arch
    p = f"{arch}."

    def meta(key: str, default: object = None) -> object:
        return reader.get(p + key, default)

    heads = int(meta("attention.head_count"))
    hidden = int(meta("embedding_length"))
    layers = int(meta("block_count"))
    head_dim = int(meta("attention.key_length") or meta("rope.dimension_count") or hidden // heads)
    names = {t.name for t in reader.tensors}
    eos = reader.get("tokenizer.ggml.eos_token_id")
    n_vocab = meta("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"])
    extra = extra or {}
    if "rope_factors_long.weight" in extra:
        long, short = extra["rope_factors_long.weight"], extra.get("rope_factors_short.weight")
        if short is None or len(short) != len(long) or len(long) != head_dim // 2:
            raise ValueError(f"LongRoPE needs rope_factors_long and rope_factors_short of head_dim / 2 = "
                             f"{head_dim // 2} values each")
        original = int(meta("rope.scaling.original_context_length") or meta("context_length", 2048))
        scaling = longrope_scaling(short, long, original, float(meta("rope.scaling.attn_factor", 1.0)))
    else:
        scaling = _rope_scaling(meta("rope.scaling.type"), meta("rope.scaling.factor"),
                                extra.get("rope_freqs.weight"))
    gemma, moe = arch in GEMMA, arch == "qwen3moe"
    expert_width = int(meta("expert_feed_forward_length", 0))
    window = meta("attention.sliding_window") if arch != "phi3" else None
    sliding: tuple[bool, ...] = ()
    if gemma and window:
        pattern = meta("attention.sliding_window_pattern", GEMMA_SWA_PATTERN[arch])
        sliding = (tuple(bool(x) for x in pattern) if isinstance(pattern, list | tuple)
                   else tuple((i + 1) % int(pattern) != 0 for i in range(layers)))
    elif window:
        sliding = (True,) * layers
    scale = None
    if gemma:  # llama.cpp: the 27B models scale by hidden / heads, the others by head_dim
        scale = (hidden / heads) ** -0.5 if layers == GEMMA_27B_LAYERS[arch] else head_dim**-0.5
    return ModelConfig(
        arch=arch,
        vocab_size=int(n_vocab),
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length") or expert_width),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(meta("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(meta("context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=reader.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
        sliding_window=int(window) if sliding else None,
        sliding_layers=sliding,
        rope_local_theta=float(meta("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE)) if arch == "gemma3" else None,
        query_scale=scale,
        hidden_act="gelu_tanh" if gemma else "silu",
        sandwich_norms=gemma,
        embed_scale=hidden**0.5 if gemma else 1.0,
        final_logit_softcap=float(meta("final_logit_softcapping")) if meta("final_logit_softcapping") else None,
        attn_logit_softcap=float(meta("attn_logit_softcapping")) if meta("attn_logit_softcapping") else None,
        num_experts=int(meta("expert_count", 0)) if moe else 0,
        num_experts_per_tok=int(meta("expert_used_count", 0)) if moe else 0,
        moe_intermediate_size=expert_width if moe else 0,
        norm_topk_prob=moe,  # llama.cpp's qwen3moe graph always renormalizes
    )


def _rope_scaling(kind: object, factor: object, freqs: tuple[float, ...] | None) -> dict | None:
    """HF-style rope scaling from GGUF's `rope.scaling.*` keys or llama 3.1's per-frequency factors."""
    if freqs is not None:
        return {"rope_type": "factors", "factors": freqs}
    if kind in (None, "none") or not factor or float(factor) == 1.0:
        return None
    if kind != "linear":
        raise ValueError(f"unsupported GGUF rope scaling type {kind!r} (supported: linear, per-frequency factors)")
    return {"rope_type": "linear", "factor": float(factor)}
