"""Our Llama-family model: Llama 2/3 (incl. llama3 RoPE scaling), SmolLM2, TinyLlama, Qwen2/2.5
(qkv bias) and Qwen3 (per-head q/k RMSNorm). GQA, rotary embeddings (HF "rotate half" layout),
RMSNorm, SwiGLU, optionally tied embeddings.

A step's tokens (mixed extend/decode, variable lengths: a ForwardBatch) run through the layers with
K/V read and written through the TokenToKVPool. q/k/v and gate/up projections are fused into one
matrix each. The weights load as plain tensors; `specialize` then picks each layer's
representations for the device (oneDNN-packed or GGUF-block linears, C per-token ops), and
`bind_kv_pool` sets up the one-call C decode step where it applies.

Under tensor parallelism (`tp`) each rank builds the same model over its shard (`sharding.py`): its
query / KV heads and MLP columns, its vocabulary rows; o_proj and down are row-parallel, the
embedding and lm_head vocab-parallel (`layers/parallel.py`). The one-call C decode is off there (the
all-reduces between layers cannot happen inside one C call); every other path is unchanged.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from radixgen.radix_cache.memory_pool import TokenToKVPool
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.kernels.block_gemm import BlockWeight, block_rows_limit, concat_rows
from radixgen.runtime.kernels.decode_attention import KV_DTYPES
from radixgen.runtime.kernels.decode_layers import DecodeDims, DecodeLayers, LayerWeights
from radixgen.runtime.layers.attention.base import AttentionBackend
from radixgen.runtime.layers.attention.layer import Attention, ForwardContext
from radixgen.runtime.layers.linear import (
    BlockLinear,
    DenseLinear,
    Linear,
    long_extend_runs,
    specialize,
    wide_rows,
)
from radixgen.runtime.layers.norm import RMSNorm, SiluAndMul
from radixgen.runtime.layers.parallel import (
    RowParallelLinear,
    ShardedLinear,
    TensorParallel,
    VocabParallelHead,
    embed_lookup,
)
from radixgen.runtime.layers.rotary import Rotary
from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.models.loader import Checkpoint
from radixgen.runtime.models.sharding import ShardPlan


def _row_parallel(linear: DenseLinear, tp: TensorParallel | None) -> Linear:
    return linear if tp is None else RowParallelLinear(linear, tp.comm)


def _dense(m: Linear) -> DenseLinear:
    """The loaded weight of a matrix (inside its tensor-parallel wrapper, if any)."""
    return m.inner if isinstance(m, ShardedLinear) else m


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, tp: TensorParallel | None) -> None:
        super().__init__()
        self.gate_up = DenseLinear(hidden, 2 * inter)  # this rank's columns of gate and up
        self.act = SiluAndMul()
        self.down = _row_parallel(DenseLinear(inter, hidden), tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate_up(x)))  # [T, hidden]


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, layer_id: int, plan: ShardPlan, tp: TensorParallel | None) -> None:
        super().__init__()
        q_size, kv_size = plan.heads * c.head_dim, plan.kv_heads * c.head_dim  # this rank's heads
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.qkv = DenseLinear(c.hidden_size, q_size + 2 * kv_size, bias=c.qkv_bias)
        self.attn = Attention(layer_id, plan.heads, plan.kv_heads, c.head_dim, c.rms_norm_eps if c.qk_norm else None)
        self.o_proj = _row_parallel(DenseLinear(q_size, c.hidden_size), tp)
        self.post_attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c.hidden_size, plan.intermediate, tp)

    def forward(self, hidden: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """hidden [T, hidden] (the residual stream) -> the same after this layer."""
        o = self.attn(self.qkv(self.input_norm(hidden)), ctx)  # [T, q]
        hidden, x = self.post_attn_norm.add(hidden, self.o_proj(o))
        return hidden.add_(self.mlp(x))

    def use_c_kernels(self) -> None:
        """Per-token ops in C (CPU float32); layers with q/k norms keep the torch path."""
        c = self.attn.can_fuse_rope
        self.input_norm.in_c = self.post_attn_norm.in_c = self.mlp.act.in_c = self.attn.rope_in_c = c


def layer_matrices(plan: ShardPlan) -> dict[str, list[tuple[str, slice | None, slice | None]]]:
    """Each fused matrix of a layer: module path -> the HF weights stacked into it, in order, with the
    (rows, columns) of each that this rank holds (None: all)."""
    q, kv, mlp = plan.q_rows(), plan.kv_rows(), plan.mlp_rows()
    return {
        "qkv": [("self_attn.q_proj", q, None), ("self_attn.k_proj", kv, None), ("self_attn.v_proj", kv, None)],
        "o_proj": [("self_attn.o_proj", None, q)],
        "mlp.gate_up": [("mlp.gate_proj", mlp, None), ("mlp.up_proj", mlp, None)],
        "mlp.down": [("mlp.down_proj", None, mlp)],
    }


class LlamaModel(nn.Module):
    """Decoder-only transformer; `forward` returns logits for `fb.logits_indices` rows."""

    def __init__(self, config: ModelConfig, max_len: int, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.config = config
        self.tp = tp
        self.plan = ShardPlan(config, tp.rank, tp.size) if tp is not None else ShardPlan(config)
        self.embed = nn.Parameter(torch.empty(self.plan.vocab, config.hidden_size))  # this rank's vocabulary rows
        self.layers = nn.ModuleList(DecoderLayer(config, i, self.plan, tp) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        head = DenseLinear(config.hidden_size, self.plan.vocab)
        if config.tie_word_embeddings:
            head.weight = self.embed
        self.lm_head: Linear = head if tp is None else VocabParallelHead(head, tp.comm, config.vocab_size)
        self.rotary = Rotary(config.inv_freq(), max_len)
        self.decode_in_c: DecodeLayers | None = None  # the one-call C decode over the bound KV pool
        self.long_extend_min: int | None = None  # extends longer than this take lower-precision fallbacks

    def specialize(self, pack: bool, blocks: dict[str, BlockWeight] | None, c_kernels: bool,
                   wide_dtype: torch.dtype | None = None) -> None:
        """Pick the representations to run in (once, after loading): oneDNN-packed matrices
        (`pack`), GGUF-block copies for small batches (`blocks`, HF names; wider batches run their
        packed fallback in `wide_dtype`, default the model's), C per-token ops."""
        blocks = blocks or {}
        if blocks and self.tp is not None:
            raise ValueError("GGUF block weights are not sharded: tensor-parallel ranks run dense shards")
        for i, layer in enumerate(self.layers):
            for path, specs in layer_matrices(self.plan).items():
                parent, _, attr = path.rpartition(".")
                owner = layer.get_submodule(parent) if parent else layer
                found = [blocks.get(f"model.layers.{i}.{n}.weight") for n, _, _ in specs]
                fused = concat_rows(found) if all(found) else None
                setattr(owner, attr, _specialize(getattr(owner, attr), fused, pack, wide_dtype=wide_dtype))
            if c_kernels:
                layer.use_c_kernels()
        self.norm.in_c = c_kernels
        tied = self.config.tie_word_embeddings
        head = blocks.get("model.embed_tokens.weight" if tied else "lm_head.weight")
        self.lm_head = _specialize(self.lm_head, head, pack, keep_dense=tied, wide_dtype=wide_dtype)
        if isinstance(self.lm_head, BlockLinear) and self.lm_head.long_extends_only:
            self.lm_head.fallback = None  # the head runs outside `wide_rows`: the block kernel takes all its rows
        if any(isinstance(m, BlockLinear) and m.long_extends_only for m in self.modules()):
            self.long_extend_min = block_rows_limit()

    def use_triton_rope(self) -> None:
        """With the Triton attention backend: each layer's rotary and K/V store in one Triton launch
        (`kernels/triton_rope.py`) instead of C or torch ops, where no q/k norm comes between."""
        from radixgen.runtime.kernels import triton_rope  # lazy: triton

        for layer in self.layers:
            layer.attn.triton_rope = triton_rope.rope_store if layer.attn.can_fuse_rope else None
            layer.attn.rope_in_c = False

    @property
    def block_weight_count(self) -> int:
        """How many matrices run on GGUF blocks (layers' fused matrices plus the head)."""
        return sum(isinstance(m, BlockLinear) for m in self.modules())

    def bind_kv_pool(self, pool: TokenToKVPool) -> None:
        """Set up the one-call C decode step over `pool` where it applies: a CPU pool of a KV dtype the
        kernels read and every layer on GGUF-block matrices (no qkv bias) with its per-token ops in C."""
        self.decode_in_c = None
        k0 = pool.k_buffer[0]
        if self.tp is not None or not DecodeLayers.available() or k0.dtype not in KV_DTYPES or k0.device.type != "cpu":
            return
        weights = []
        for i, layer in enumerate(self.layers):
            mats = (layer.qkv, layer.o_proj, layer.mlp.gate_up, layer.mlp.down)
            if not (layer.attn.rope_in_c and layer.qkv.bias is None and all(isinstance(m, BlockLinear) for m in mats)):
                return
            weights.append(LayerWeights(layer.input_norm.weight, layer.post_attn_norm.weight, pool.k_buffer[i],
                                        pool.v_buffer[i], *(m.panels for m in mats)))
        a, mlp = self.layers[0].attn, self.layers[0].mlp
        dims = DecodeDims(a.num_heads, a.num_kv_heads, a.head_dim, mlp.down.in_features, self.config.rms_norm_eps,
                          a.scale)
        limit = None if self.long_extend_min is not None else block_rows_limit()
        self.decode_in_c = DecodeLayers(weights, dims, limit or sys.maxsize)

    def matrices_in_c(self, extend_lens: list[int]) -> bool:
        """Whether every matrix row of a step whose requests extend by `extend_lens` runs in the C block
        kernel (a model with the one-call C decode): up to its row limit, at any number of rows on AMX,
        and where long chunks take bfloat16 GEMMs, in any step without one."""
        if self.decode_in_c is None:
            return False
        if self.long_extend_min is not None:
            return all(n <= self.long_extend_min for n in extend_lens)
        return sum(extend_lens) <= self.decode_in_c.max_rows

    @torch.inference_mode()
    def forward(
        self,
        fb: ForwardBatch,
        pool: TokenToKVPool,
        req_to_token: torch.Tensor,
        backend: AttentionBackend,
        meta: object | None = None,
    ) -> torch.Tensor:
        """Logits [L, V] (float32) of `fb.logits_indices`; `meta`: prebuilt attention metadata
        (a CUDA graph's static one), else built from `fb`."""
        if meta is None:
            meta = backend.init_metadata(fb, req_to_token)
        h = embed_lookup(self.embed, fb.input_ids, self.tp)  # [T, hidden]
        call = backend.decode_step(meta) if self.decode_in_c is not None else None
        if call is not None and h.shape[0] <= self.decode_in_c.max_rows:
            self.decode_in_c.run(h, fb.positions, fb.out_cache_loc, self.rotary.cos, self.rotary.sin, call.req_to_token,
                                 call.req_rows, call.seq_lens, call.shared)
        else:
            ctx = ForwardContext(fb, pool, backend, meta, self.rotary)
            if not all(layer.attn.rope_in_c or layer.attn.triton_rope is not None for layer in self.layers):
                ctx.cos, ctx.sin = self.rotary.gather(fb.positions, h.dtype)
            long = self.long_extend_min
            with wide_rows(() if long is None else long_extend_runs(fb.extend_lens, long)):
                for layer in self.layers:
                    h = layer(h, ctx)
        if not (fb.is_decode and fb.logits_indices.shape[0] == h.shape[0]):  # a decode's rows are its logits rows
            h = h.index_select(0, fb.logits_indices)  # [L, hidden]
        return self.lm_head(self.norm(h)).float()  # [L, V]

    def load_weights(self, ckpt: Checkpoint) -> None:
        """Copy this rank's part of the HF-named checkpoint tensors into our fused parameters (reading
        only that part; fails loudly on missing names)."""
        plan = self.plan
        vocab = plan.vocab_rows()
        with torch.no_grad():
            _copy_rows(self.embed, ckpt.get("model.embed_tokens.weight", rows=vocab))
            self.norm.weight.copy_(ckpt.get("model.norm.weight"))
            if not self.config.tie_word_embeddings:
                _copy_rows(_dense(self.lm_head).weight, ckpt.get("lm_head.weight", rows=vocab))
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{i}."
                layer.input_norm.weight.copy_(ckpt.get(p + "input_layernorm.weight"))
                layer.post_attn_norm.weight.copy_(ckpt.get(p + "post_attention_layernorm.weight"))
                matrices = layer_matrices(plan)
                if layer.qkv.bias is not None:
                    layer.qkv.bias.copy_(torch.cat([ckpt.get(p + n + ".bias", rows=r) for n, r, _ in matrices["qkv"]]))
                if layer.attn.q_norm is not None:
                    layer.attn.q_norm.copy_(ckpt.get(p + "self_attn.q_norm.weight"))
                    layer.attn.k_norm.copy_(ckpt.get(p + "self_attn.k_norm.weight"))
                for path, specs in matrices.items():
                    parts = [ckpt.get(p + n + ".weight", rows=r, cols=c) for n, r, c in specs]
                    _dense(layer.get_submodule(path)).weight.copy_(torch.cat(parts))


def _specialize(m: Linear, blocks: BlockWeight | None, pack: bool, keep_dense: bool = False,
                wide_dtype: torch.dtype | None = None) -> Linear:
    """`specialize` for a plain matrix or for the matrix inside a tensor-parallel wrapper."""
    if isinstance(m, ShardedLinear):
        m.inner = specialize(m.inner, blocks, pack, keep_dense, wide_dtype)
        return m
    return specialize(m, blocks, pack, keep_dense, wide_dtype)


def _copy_rows(param: torch.Tensor, rows: torch.Tensor) -> None:
    """Copy `rows` into the first rows of `param`; zero the rest (a padded last vocabulary shard)."""
    param[: rows.shape[0]].copy_(rows)
    param[rows.shape[0] :].zero_()
