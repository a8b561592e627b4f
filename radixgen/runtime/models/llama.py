"""Our Llama-family model: Llama 2/3 (incl. llama3 RoPE scaling), SmolLM2, TinyLlama, Qwen2/2.5
(qkv bias) and Qwen3 (per-head q/k RMSNorm). GQA, rotary embeddings (HF "rotate half" layout),
RMSNorm, SwiGLU, optionally tied embeddings.

The forward pass takes a ForwardBatch (mixed extend/decode, variable lengths) and reads/writes K/V
through the TokenToKVPool. q/k/v and gate/up projections are fused into one matmul each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.radix_cache.memory_pool import TokenToKVPool
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.kernels import layer_ops as cpu_layer_ops
from radixgen.runtime.kernels.block_gemm import (
    BlockWeight,
    PanelWeight,
    block_linear,
    concat_rows,
    pack_panels,
    use_blocks,
)
from radixgen.runtime.kernels.decode_layers import FusedDecode
from radixgen.runtime.layers.attention import AttentionBackend
from radixgen.runtime.layers.packed_linear import pack_parameter, pack_weight, packed_linear
from radixgen.runtime.models.config import ModelConfig


class Rotary(nn.Module):
    """cos/sin tables for all positions up to max_len, HF rotate-half layout."""

    def __init__(self, config: ModelConfig, max_len: int) -> None:
        super().__init__()
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), config.inv_freq())  # [P, D/2]
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, H, D]; cos/sin: [T, 1, D/2]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        c = config
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.eps = c.rms_norm_eps
        self.scale = c.head_dim**-0.5
        self.input_norm = nn.Parameter(torch.ones(c.hidden_size))
        self.post_attn_norm = nn.Parameter(torch.ones(c.hidden_size))
        self.qkv = nn.Parameter(torch.empty(self.q_size + 2 * self.kv_size, c.hidden_size))
        self.qkv_bias = nn.Parameter(torch.zeros(self.q_size + 2 * self.kv_size)) if c.qkv_bias else None
        self.q_norm = nn.Parameter(torch.ones(c.head_dim)) if c.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(c.head_dim)) if c.qk_norm else None
        self.o_proj = nn.Parameter(torch.empty(c.hidden_size, self.q_size))
        self.gate_up = nn.Parameter(torch.empty(2 * c.intermediate_size, c.hidden_size))
        self.down = nn.Parameter(torch.empty(c.hidden_size, c.intermediate_size))
        self._packed: dict[str, torch.Tensor] = {}  # oneDNN-packed copies of the matrices (CPU)
        self._blocks: dict[str, PanelWeight] = {}  # GGUF-block copies for decoding (CPU float32)
        self.fused_ops = False  # per-token ops through `cpu_layer_ops` (CPU float32, no q/k norm)

    def pack_weights(self) -> None:
        """Replace the four matrices by oneDNN-packed copies (see `packed_linear`); one-way."""
        self._packed = {name: pack_parameter(getattr(self, name)) for name in ("qkv", "o_proj", "gate_up", "down")}

    def set_block_weights(self, blocks: dict[str, BlockWeight], prefix: str) -> None:
        """Keep GGUF-block copies of the matrices whose parts are all in `blocks` in one format."""
        a = prefix + "self_attn."
        parts = {"qkv": [a + "q_proj", a + "k_proj", a + "v_proj"], "o_proj": [a + "o_proj"],
                 "gate_up": [prefix + "mlp.gate_proj", prefix + "mlp.up_proj"], "down": [prefix + "mlp.down_proj"]}
        for name, hf_names in parts.items():
            found = [blocks.get(n + ".weight") for n in hf_names]
            fused = concat_rows(found) if all(found) else None
            if fused is not None:
                self._blocks[name] = pack_panels(fused)

    def _linear(self, x: torch.Tensor, name: str, bias: torch.Tensor | None = None) -> torch.Tensor:
        block = self._blocks.get(name)
        if block is not None and use_blocks(x):
            y = block_linear(x, block)
            return y if bias is None else y + bias
        if self._packed:
            return packed_linear(x, self._packed[name], bias)
        return F.linear(x, getattr(self, name), bias)

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor | None,  # [T, 1, D/2] (None for fused layers)
        sin: torch.Tensor | None,
        rotary: Rotary,
        fb: ForwardBatch,
        attn: AttentionBackend,
        meta: object,
        pool: TokenToKVPool,
    ) -> torch.Tensor:
        if self.fused_ops:
            return self._forward_fused(h, rotary, fb, attn, meta, pool)
        t = h.shape[0]
        x = F.rms_norm(h, (h.shape[-1],), self.input_norm, self.eps)
        qkv = self._linear(x, "qkv", self.qkv_bias)  # [T, q + 2 kv]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = F.rms_norm(q, (self.head_dim,), self.q_norm, self.eps)
            k = F.rms_norm(k, (self.head_dim,), self.k_norm, self.eps)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        pool.set_kv(self.layer_id, fb.out_cache_loc, k, v.view(t, self.num_kv_heads, self.head_dim))
        o = attn.forward(q, pool.k_buffer[self.layer_id], pool.v_buffer[self.layer_id], meta, self.scale)
        h = h + self._linear(o, "o_proj")  # [T, hidden]
        x = F.rms_norm(h, (h.shape[-1],), self.post_attn_norm, self.eps)
        gate, up = self._linear(x, "gate_up").chunk(2, dim=-1)  # [T, inter] each
        return h + self._linear(F.silu(gate) * up, "down")

    def _forward_fused(self, h: torch.Tensor, rotary: Rotary, fb: ForwardBatch, attn: AttentionBackend, meta: object,
                       pool: TokenToKVPool) -> torch.Tensor:
        """`forward` with the per-token ops fused in C; h [T, hidden] is updated in place."""
        t = h.shape[0]
        ops = cpu_layer_ops
        qkv = self._linear(ops.add_rms_norm(h, self.input_norm, self.eps), "qkv", self.qkv_bias)  # [T, q + 2 kv]
        k_buf, v_buf = pool.k_buffer[self.layer_id], pool.v_buffer[self.layer_id]
        ops.rope_store(qkv, self.num_heads, self.num_kv_heads, rotary.cos, rotary.sin, fb.positions,
                       fb.out_cache_loc, k_buf, v_buf)
        q = qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim)
        o = attn.forward(q, k_buf, v_buf, meta, self.scale)  # [T, q]
        x = ops.add_rms_norm(h, self.post_attn_norm, self.eps, delta=self._linear(o, "o_proj"))  # h += o_proj(o)
        return h.add_(self._linear(ops.silu_mul(self._linear(x, "gate_up")), "down"))


class LlamaModel(nn.Module):
    """Decoder-only transformer; `forward` returns logits for `fb.logits_indices` rows."""

    def __init__(self, config: ModelConfig, max_len: int) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.lm_head = None if config.tie_word_embeddings else nn.Parameter(torch.empty_like(self.embed))
        self.rotary = Rotary(config, max_len)
        self._packed_head: torch.Tensor | None = None
        self._block_head: PanelWeight | None = None
        self.fused_ops = False  # every layer fused (`use_fused_ops`): no per-step cos/sin gather
        self._fused_decode: tuple[TokenToKVPool, FusedDecode | None] | None = None  # (pool, its C decode or None)

    def use_fused_ops(self) -> None:
        """Run the per-token ops of every layer through `cpu_layer_ops` (CPU, float32; layers with
        q/k norms keep the torch path)."""
        for layer in self.layers:
            layer.fused_ops = layer.q_norm is None
        self.fused_ops = all(layer.fused_ops for layer in self.layers)

    def set_block_weights(self, blocks: dict[str, BlockWeight]) -> None:
        """Decode through GGUF-block copies of the matrices found in `blocks` (HF names); see
        `block_gemm`. Larger batches (prefill) keep using the dense weights."""
        for i, layer in enumerate(self.layers):
            layer.set_block_weights(blocks, f"model.layers.{i}.")
        head = "model.embed_tokens.weight" if self.lm_head is None else "lm_head.weight"
        self._block_head = pack_panels(blocks[head]) if head in blocks else None

    @property
    def block_weight_count(self) -> int:
        """How many matrices have a block copy (layers' fused matrices plus the head)."""
        return sum(len(layer._blocks) for layer in self.layers) + (self._block_head is not None)

    def pack_weights(self) -> None:
        """Prepack every matrix for oneDNN (CPU, float32/bfloat16): about 1.5-2x faster GEMMs at
        small batch than `F.linear` here. The embedding stays plain for the token lookup."""
        for layer in self.layers:
            layer.pack_weights()
        # a tied head shares the embedding, which the token lookup still needs in plain layout
        self._packed_head = pack_weight(self.embed.detach()) if self.lm_head is None else pack_parameter(self.lm_head)

    @torch.inference_mode()
    def forward(
        self,
        fb: ForwardBatch,
        pool: TokenToKVPool,
        req_to_token: torch.Tensor,
        attn: AttentionBackend,
        meta: object | None = None,
    ) -> torch.Tensor:
        """Logits [L, V] (float32) of `fb.logits_indices`; `meta`: prebuilt attention metadata
        (a CUDA graph's static one), else built from `fb`."""
        if meta is None:
            meta = attn.build(fb, req_to_token)
        h = self.embed.index_select(0, fb.input_ids)  # [T, hidden]
        cos = sin = None  # fused layers read the full tables in C
        if not self.fused_ops:
            cos = self.rotary.cos.index_select(0, fb.positions).unsqueeze(1).to(h.dtype)  # [T, 1, D/2]
            sin = self.rotary.sin.index_select(0, fb.positions).unsqueeze(1).to(h.dtype)
        call = FusedDecode.call_of(h, meta) if self.fused_ops else None
        fused = self._decode_in_c(pool) if call is not None else None
        if fused is not None:
            fused.run(h, fb, call, self.rotary.cos, self.rotary.sin)
        else:
            for layer in self.layers:
                h = layer(h, cos, sin, self.rotary, fb, attn, meta, pool)
        h = h.index_select(0, fb.logits_indices)  # [L, hidden]
        h = F.rms_norm(h, (h.shape[-1],), self.norm, self.config.rms_norm_eps)
        if self._block_head is not None and use_blocks(h):
            return block_linear(h, self._block_head)  # [L, V]
        if self._packed_head is not None:
            return packed_linear(h, self._packed_head).float()  # [L, V]
        head = self.embed if self.lm_head is None else self.lm_head
        return F.linear(h, head).float()  # [L, V]

    def _decode_in_c(self, pool: TokenToKVPool) -> FusedDecode | None:
        """The runner of all layers in one C call for decode steps over `pool`, if it applies (see
        `fused_decode`); decided once per pool."""
        if self._fused_decode is None or self._fused_decode[0] is not pool:
            fused = FusedDecode(self.layers, pool) if FusedDecode.supported(self.layers, pool) else None
            self._fused_decode = (pool, fused)
        return self._fused_decode[1]

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy HF-named tensors into our fused parameters (fails loudly on missing names)."""

        def take(name: str) -> torch.Tensor:
            if name not in weights:
                raise KeyError(f"weight {name!r} missing from the checkpoint")
            return weights[name]

        with torch.no_grad():
            self.embed.copy_(take("model.embed_tokens.weight"))
            self.norm.copy_(take("model.norm.weight"))
            if self.lm_head is not None:
                self.lm_head.copy_(take("lm_head.weight"))
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{i}."
                a = p + "self_attn."
                layer.input_norm.copy_(take(p + "input_layernorm.weight"))
                layer.post_attn_norm.copy_(take(p + "post_attention_layernorm.weight"))
                layer.qkv.copy_(torch.cat([take(a + f"{n}_proj.weight") for n in "qkv"]))
                if layer.qkv_bias is not None:
                    layer.qkv_bias.copy_(torch.cat([take(a + f"{n}_proj.bias") for n in "qkv"]))
                if layer.q_norm is not None:
                    layer.q_norm.copy_(take(a + "q_norm.weight"))
                    layer.k_norm.copy_(take(a + "k_norm.weight"))
                layer.o_proj.copy_(take(a + "o_proj.weight"))
                layer.gate_up.copy_(torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]))
                layer.down.copy_(take(p + "mlp.down_proj.weight"))
