"""ModelConfig: the architecture facts our decoder implementation needs, from HF or GGUF.

One decoder covers the families below; what differs between them is data here: q/k/v bias (Qwen2),
per-head q/k norms (Qwen3, Gemma 3), sliding-window layers (Mistral, Gemma 2 and 3: which layers, how
wide, their own rotary base), a soft-cap on attention scores (Gemma 2), q/k/v and gate/up matrices the
checkpoint holds already fused (Phi-3), norms after attention and MLP as well as before (Gemma), GeGLU (Gemma), a
scaled embedding (Gemma), the query scale, a final logit soft-cap, and mixture-of-experts MLPs
(Qwen3-MoE: how many experts, how many each token uses, their width, which layers are sparse).

Rotary scaling: llama3, linear, GGUF's per-frequency factors, and LongRoPE (Phi-3's 128k models: one
set of per-frequency divisors for contexts up to the pretraining length, another beyond it, and cos/sin
scaled by an attention factor). HF switches LongRoPE's set per forward call by the sequence's length,
which would leave a sequence's cached keys rotated by the other set once it grows past that length; we
pick the set once, by the served context length, as llama.cpp does (`inv_freq(context)`), so every
cached key of every sequence is rotated alike and the radix cache can share them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
    "Qwen3MoeForCausalLM": "qwen3moe",
}
GEMMA = ("gemma2", "gemma3")
GEMMA_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}  # HF's default: every n-th layer global, the others windowed


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Llama / SmolLM / Mistral / Qwen2 / Qwen3 / Qwen3-MoE / Phi-3 / Gemma 2 / Gemma 3 model."""

    arch: str  # "llama" | "qwen2" | "qwen3" | "qwen3moe" | "phi3" | "gemma2" | "gemma3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    sliding_window: int | None = None  # keys a sliding-window layer attends to (its own token included)
    sliding_layers: tuple[bool, ...] = ()  # per layer: whether it is a sliding-window layer (empty: none)
    rope_local_theta: float | None = None  # sliding-window layers' rotary base (None: rope_theta), unscaled
    query_scale: float | None = None  # attention's score scale (None: head_dim ** -0.5)
    hidden_act: str = "silu"  # the MLP's gate activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    sandwich_norms: bool = False  # RMSNorm on the attention and MLP outputs too, before the residual adds
    embed_scale: float = 1.0  # the embedding's rows are multiplied by this
    norm_weight_offset: float = 0.0  # added to every RMSNorm weight at load (HF Gemma computes x * (1 + w))
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    attn_logit_softcap: float | None = None  # attention scores = cap * tanh(scores / cap) before the softmax
    num_experts: int = 0  # experts of each sparse (MoE) layer's MLP (0: every MLP is dense)
    num_experts_per_tok: int = 0  # experts each token is routed to (top-k)
    moe_intermediate_size: int = 0  # each expert's MLP width
    norm_topk_prob: bool = False  # the top-k routing weights renormalized to sum to 1
    decoder_sparse_step: int = 1  # layer i is sparse when (i + 1) % step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and it is not listed here (HF Qwen3-MoE's rule)

    @property
    def qkv_bias(self) -> bool:
        return self.arch == "qwen2"

    @property
    def fused_checkpoint(self) -> bool:
        """The checkpoint holds q/k/v as one matrix and gate/up as another (Phi-3's qkv_proj, gate_up_proj)."""
        return self.arch == "phi3"

    @property
    def qk_norm(self) -> bool:
        return self.arch in ("qwen3", "qwen3moe", "gemma3")

    def is_moe(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is a mixture of experts (else a dense one of `intermediate_size`)."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    def window(self, layer: int) -> int | None:
        """The sliding window of layer `layer` (None: it attends to every earlier token)."""
        return self.sliding_window if self.sliding_layers and self.sliding_layers[layer] else None

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}: radixgen runs "
                f"{sorted(SUPPORTED_ARCHITECTURES)}"
            )
        params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        local = params.pop("sliding_attention", None)  # per layer type (transformers 5: Gemma 3)
        rope = dict(params.pop("full_attention", None) or params)
        theta = rope.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        if rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError("partial rotary embeddings (partial_rotary_factor < 1) are not supported")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type in ("longrope", "su"):  # "su": LongRoPE's name in Phi-3's first 128k configs
            rope = _longrope(cfg, rope)
            rope_type = "longrope"
        elif rope_type not in ("default", "llama3", "linear"):
            raise ValueError(f"unsupported rope scaling type {rope_type!r} (supported: default, llama3, linear, "
                             "longrope)")
        local_theta = (local or {}).get("rope_theta") or cfg.get("rope_local_base_freq")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        heads = cfg["num_attention_heads"]
        layers = cfg["num_hidden_layers"]
        gemma = arch in GEMMA
        window = cfg.get("sliding_window")
        if window is not None and arch == "qwen2" and not cfg.get("use_sliding_window", False):
            window = None  # Qwen2 configs carry a window they do not use
        if window is None:
            sliding: tuple[bool, ...] = ()
        elif "layer_types" in cfg:
            sliding = tuple(t == "sliding_attention" for t in cfg["layer_types"])
        elif gemma:
            pattern = cfg.get("sliding_window_pattern", GEMMA_SWA_PATTERN[arch])
            sliding = tuple((i + 1) % pattern != 0 for i in range(layers))
        else:
            sliding = (True,) * layers
        hidden = cfg["hidden_size"]
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
        if act not in ("silu", "gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"unsupported MLP activation {act!r} (supported: silu, gelu_pytorch_tanh)")
        scalar = cfg.get("query_pre_attn_scalar")
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            rope_scaling=rope if rope_type != "default" else None,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_window=int(window) if sliding and any(sliding) else None,
            sliding_layers=sliding if any(sliding) else (),
            rope_local_theta=float(local_theta) if local_theta else None,
            query_scale=float(scalar) ** -0.5 if scalar else None,
            hidden_act="silu" if act == "silu" else "gelu_tanh",
            sandwich_norms=gemma,
            embed_scale=hidden**0.5 if gemma else 1.0,
            norm_weight_offset=1.0 if gemma else 0.0,
            final_logit_softcap=cfg.get("final_logit_softcapping"),
            attn_logit_softcap=cfg.get("attn_logit_softcapping"),
            **(_moe_fields(cfg) if arch == "qwen3moe" else {}),
        )

    def local_inv_freq(self) -> torch.Tensor | None:
        """Sliding-window layers' own RoPE inverse frequencies [head_dim / 2] (None: they share
        `inv_freq`): base `rope_local_theta`, no scaling."""
        if self.rope_local_theta is None or not self.sliding_layers:
            return None
        d = self.head_dim
        return (1.0 / (self.rope_local_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))).float()

    @property
    def rope_attention_factor(self) -> float:
        """What the rotary cos/sin tables are multiplied by (LongRoPE's attention factor; else 1)."""
        rs = self.rope_scaling
        return float(rs["attention_factor"]) if rs is not None and rs.get("rope_type") == "longrope" else 1.0

    def inv_freq(self, context: int | None = None) -> torch.Tensor:
        """RoPE inverse frequencies [head_dim / 2], with llama3 / linear / per-frequency scaling applied;
        LongRoPE divides by its long factors where the served `context` (tokens a sequence may reach)
        is past the pretraining length, else by its short ones."""
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        rs = self.rope_scaling
        if rs is None:
            return inv.float()
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "longrope":
            long = context is not None and context > rs["original_max_position_embeddings"]
            factors = rs["long_factor"] if long else rs["short_factor"]
            return (inv / torch.tensor(factors, dtype=torch.float64)).float()
        if kind == "factors":  # GGUF's per-frequency divisors (llama.cpp's rope_freqs tensor)
            return (inv / torch.tensor(rs["factors"], dtype=torch.float64)).float()
        if kind == "linear":
            return (inv / rs["factor"]).float()
        # llama3: keep high frequencies, divide low ones by `factor`, interpolate in between.
        factor, lo, hi = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old_ctx = rs.get("original_max_position_embeddings", 8192)
        low_wavelen, high_wavelen = old_ctx / lo, old_ctx / hi
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_mid, mid, scaled).float()


def _longrope(cfg: dict, rope: dict) -> dict:
    """LongRoPE's scaling from an HF config: its short / long per-frequency factors, the pretraining
    length that picks between them (Phi-3 keeps it beside, not inside, the rope dict) and the cos/sin
    attention factor (HF's default where the config gives none: sqrt(1 + ln(s) / ln(L)), s the context
    extension max_position_embeddings / L)."""
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    short, long = rope.get("short_factor"), rope.get("long_factor")
    if short is None or long is None or len(short) != head_dim // 2 or len(long) != head_dim // 2:
        raise ValueError(f"longrope scaling needs short_factor and long_factor lists of head_dim / 2 = "
                         f"{head_dim // 2} numbers each")
    original = int(cfg.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
                   or cfg.get("max_position_embeddings", 2048))
    factor = rope.get("factor") or cfg.get("max_position_embeddings", original) / original
    attention = rope.get("attention_factor")
    if attention is None:
        attention = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
    return longrope_scaling(short, long, original, attention)


def longrope_scaling(short: list[float] | tuple[float, ...], long: list[float] | tuple[float, ...],
                     original: int, attention_factor: float) -> dict:
    """ModelConfig's rope_scaling for LongRoPE (from HF's config or GGUF's rope_factors tensors)."""
    return {"rope_type": "longrope", "short_factor": tuple(float(x) for x in short),
            "long_factor": tuple(float(x) for x in long), "original_max_position_embeddings": int(original),
            "attention_factor": float(attention_factor)}


def _moe_fields(cfg: dict) -> dict:
    """ModelConfig's mixture-of-experts fields from a Qwen3-MoE config.json (transformers 5 saves the
    expert count as `num_local_experts`)."""
    return dict(
        num_experts=cfg.get("num_experts") or cfg["num_local_experts"],
        num_experts_per_tok=cfg["num_experts_per_tok"],
        moe_intermediate_size=cfg["moe_intermediate_size"],
        norm_topk_prob=cfg.get("norm_topk_prob", False),
        decoder_sparse_step=cfg.get("decoder_sparse_step", 1),
        mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
    )
