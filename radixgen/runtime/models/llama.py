"""Our decoder: Llama 2/3 (incl. llama3 RoPE scaling), SmolLM2, TinyLlama, Mistral (sliding window),
Qwen2/2.5 (qkv bias), Qwen3 (per-head q/k RMSNorm), Qwen3-MoE (Qwen3 with mixture-of-experts MLPs:
`moe.py`) and Gemma 3 (sliding-window layers with their own rotary base, q/k norms, norms after
attention and MLP too, GeGLU, a scaled embedding), Gemma 2
(Gemma 3 without q/k norms or a local rotary base, its attention scores soft-capped) and Phi-3 (q/k/v
and gate/up fused in its checkpoints too; LongRoPE for its 128k models). GQA, rotary
embeddings (HF "rotate half" layout), RMSNorm, optionally tied embeddings; what differs between the
families is data in ModelConfig.

A step's tokens (mixed extend/decode, variable lengths: a ForwardBatch) run through the layers with
K/V read and written through the TokenToKVPool. q/k/v and gate/up projections are fused into one
matrix each. `load_weights` reads each matrix into its representation: the GGUF blocks themselves
(BlockLinear; the embedding table too) on a float32 CPU, else a plain tensor; `specialize` then
packs the plain ones for oneDNN, sets how the block matrices take wide steps and turns on the C
per-token ops, and sets up the one-call C decode step where it applies (`prepare`, with a `RunSetup`).

Under tensor parallelism (`tp`) each rank builds the same model over its shard (`sharding.py`): its
query / KV heads and MLP columns, its vocabulary rows; o_proj and down are row-parallel, the
embedding and lm_head vocab-parallel (`layers/parallel.py`). A mixture-of-experts layer holds every
expert over its columns of the expert width, the router replicated, and all-reduces its output once
(`moe.py`). The one-call C decode is off there (the all-reduces between layers cannot happen inside
one C call); every other path is unchanged. Mixture-of-experts layers, on one rank too, never take
the one-call C decode (it runs dense MLPs only).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from radixgen.radix_cache.memory_pool import TokenToKVPool
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.executor.step_plan import StepPlan, plan_step
from radixgen.runtime.kernels.block_gemm import (
    WIDE_ROWS,
    PanelWeight,
    block_rows_limit,
    concat_rows,
    pack_panels,
    pack_panels_by_rows,
)
from radixgen.runtime.kernels.decode_attention import KV_DTYPES
from radixgen.runtime.kernels.decode_layers import DecodeDims, DecodeLayers, LayerWeights, WindowKeys
from radixgen.runtime.layers.attention import softcap
from radixgen.runtime.layers.attention.base import AttentionBackend
from radixgen.runtime.layers.attention.layer import Attention, ForwardContext
from radixgen.runtime.layers.linear import (
    BlockLinear,
    ConcatLinear,
    DenseLinear,
    Linear,
    Runs,
    StoredLinear,
    WideMatmul,
    pack,
    runs_among,
)
from radixgen.runtime.layers.norm import GeluAndMul, RMSNorm, SiluAndMul
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
from radixgen.runtime.models.moe import MoEMLP
from radixgen.runtime.models.sharding import ShardPlan


def _row_parallel(linear: DenseLinear, tp: TensorParallel | None) -> Linear:
    return linear if tp is None else RowParallelLinear(linear, tp.comm)


def _dense(m: Linear) -> DenseLinear:
    """The loaded weight of a matrix (inside its tensor-parallel wrapper, if any)."""
    return m.inner if isinstance(m, ShardedLinear) else m


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, tp: TensorParallel | None, act: str = "silu") -> None:
        super().__init__()
        self.gate_up = DenseLinear(hidden, 2 * inter)  # this rank's columns of gate and up
        self.act = SiluAndMul() if act == "silu" else GeluAndMul()
        self.down = _row_parallel(DenseLinear(inter, hidden), tp)

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        return self.down(self.act(self.gate_up(x, wide)), wide)  # [T, hidden]


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, layer_id: int, plan: ShardPlan, tp: TensorParallel | None) -> None:
        super().__init__()
        q_size, kv_size = plan.heads * c.head_dim, plan.kv_heads * c.head_dim  # this rank's heads
        window = c.window(layer_id)
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.qkv = DenseLinear(c.hidden_size, q_size + 2 * kv_size, bias=c.qkv_bias)
        self.attn = Attention(layer_id, plan.heads, plan.kv_heads, c.head_dim, c.rms_norm_eps if c.qk_norm else None,
                              c.query_scale, window, local_rope=window is not None and c.rope_local_theta is not None,
                              softcap=c.attn_logit_softcap)
        self.o_proj = _row_parallel(DenseLinear(q_size, c.hidden_size), tp)
        # the norm before the MLP (HF: Llama's post_attention_layernorm, Gemma's pre_feedforward_layernorm)
        self.post_attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        if c.is_moe(layer_id):
            self.mlp: MLP | MoEMLP = MoEMLP(c.hidden_size, plan.expert_intermediate, c.num_experts,
                                            c.num_experts_per_tok, c.norm_topk_prob, tp)
        else:
            self.mlp = MLP(c.hidden_size, plan.intermediate, tp, c.hidden_act)
        # Gemma: norms on the attention's and the MLP's outputs before each residual add
        self.attn_out_norm = RMSNorm(c.hidden_size, c.rms_norm_eps) if c.sandwich_norms else None
        self.mlp_out_norm = RMSNorm(c.hidden_size, c.rms_norm_eps) if c.sandwich_norms else None

    def forward(self, hidden: torch.Tensor, ctx: ForwardContext, rows: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [T, hidden] (the residual stream) -> the same after this layer; with `rows` (ascending, R of
        them) only those rows' [R, hidden]: every row's K/V is stored, but the others skip o_proj and the MLP
        (the last layer, whose output is read at the logits rows alone)."""
        a = self.attn(self.qkv(self.input_norm(hidden), ctx.wide), ctx)  # [T, H * D]
        wide = ctx.wide
        if rows is not None:
            a, hidden, wide = a.index_select(0, rows), hidden.index_select(0, rows), runs_among(wide, rows)
        o = self.o_proj(a, wide)  # [T or R, hidden]
        if self.attn_out_norm is not None:
            o = self.attn_out_norm(o)
        hidden, x = self.post_attn_norm.add(hidden, o)
        m = self.mlp(x, wide)  # [T or R, hidden]
        return hidden.add_(m if self.mlp_out_norm is None else self.mlp_out_norm(m))

    @property
    def one_call(self) -> bool:
        """What the one-call C decode runs: uncapped attention (global or windowed, q/k norms or not) and a
        dense MLP (not a mixture of experts), its per-token ops in C."""
        return self.attn.softcap is None and isinstance(self.mlp, MLP) and self.attn.rope_in_c

    def use_c_kernels(self) -> None:
        """Per-token ops in C (CPU float32): the norms; SiLU or GELU * up; q/k norms + rotary + K/V store."""
        for norm in (self.input_norm, self.post_attn_norm, self.attn_out_norm, self.mlp_out_norm):
            if norm is not None:
                norm.in_c = True
        self.mlp.act.in_c = True
        self.attn.rope_in_c = True


def layer_matrices(plan: ShardPlan, layer_id: int) -> dict[str, list[tuple[str, slice | None, slice | None]]]:
    """Each fused matrix of layer `layer_id`: module path -> the HF weights stacked into it, in order,
    with the (rows, columns) of each that this rank holds (None: all). A mixture-of-experts layer has a
    router (all of it on every rank) and each expert's gate/up (this rank's rows) and down (the same
    columns)."""
    q, kv, mlp = plan.q_rows(), plan.kv_rows(), plan.mlp_rows()
    fused = _fused_checkpoint_parts(plan) if plan.config.fused_checkpoint else {}
    attn = {
        "qkv": [("self_attn.q_proj", q, None), ("self_attn.k_proj", kv, None), ("self_attn.v_proj", kv, None)],
        "o_proj": [("self_attn.o_proj", None, q)],
    }
    if not plan.config.is_moe(layer_id):
        return attn | {"mlp.gate_up": [("mlp.gate_proj", mlp, None), ("mlp.up_proj", mlp, None)],
                       "mlp.down": [("mlp.down_proj", None, mlp)]} | fused
    experts, inner = {}, plan.expert_rows()
    for e in range(plan.config.num_experts):
        p = f"mlp.experts.{e}"
        experts[f"{p}.gate_up"] = [(f"{p}.gate_proj", inner, None), (f"{p}.up_proj", inner, None)]
        experts[f"{p}.down"] = [(f"{p}.down_proj", None, inner)]
    return attn | {"mlp.router": [("mlp.gate", None, None)]} | experts


def _fused_checkpoint_parts(plan: ShardPlan) -> dict[str, list[tuple[str, slice | None, slice | None]]]:
    """q/k/v and gate/up where the checkpoint holds each as one tensor (Phi-3's qkv_proj, gate_up_proj):
    the whole tensor on one rank, else this rank's rows of each of its parts."""
    if plan.size == 1:
        return {"qkv": [("self_attn.qkv_proj", None, None)], "mlp.gate_up": [("mlp.gate_up_proj", None, None)]}
    c = plan.config
    q_all, kv_all = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim  # rows of q and of k (v) in the tensor
    kv, mlp = plan.kv_rows(), plan.mlp_rows()
    return {"qkv": [("self_attn.qkv_proj", r, None) for r in (plan.q_rows(), _shift(kv, q_all),
                                                               _shift(kv, q_all + kv_all))],
            "mlp.gate_up": [("mlp.gate_up_proj", r, None) for r in (mlp, _shift(mlp, c.intermediate_size))]}


def _shift(rows: slice, by: int) -> slice:
    return slice(rows.start + by, rows.stop + by)


@dataclass(frozen=True)
class RunSetup:
    """How a loaded model runs on its device, decided once by its ModelRunner."""

    pack_dense: bool  # plain matrices reordered for oneDNN
    c_kernels: bool  # per-token ops (norms, SiLU * up, rotary + K/V store) in C
    wide: WideMatmul = WideMatmul(torch.float32)  # the block matrices' wide rows (below float32: long extends' only)
    triton_rope: bool = False  # rotary + K/V store in one Triton launch (the Triton attention backend)


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
        self.rotary = Rotary(config.inv_freq(max_len), max_len, config.rope_attention_factor)
        local = config.local_inv_freq()
        self.local_rotary = Rotary(local, max_len) if local is not None else None  # sliding-window layers'
        self.window = config.sliding_window  # the sliding-window layers' window (None: no such layer)
        self.decode_in_c: DecodeLayers | None = None  # the one-call C decode over the bound KV pool
        self.long_extend_min: int | None = None  # extends longer than this take lower-precision fallbacks
        self.wide_in_c = False  # those extends' rows stay in the block kernel (fewer activation limbs)

    def prepare(self, setup: RunSetup, pool: TokenToKVPool) -> None:
        """Set the loaded model up to run (once, after `load_weights` and the move to the device): the
        representations and paths of `setup`, then the one-call C decode over `pool` where it applies."""
        self._specialize(setup.pack_dense, setup.c_kernels, setup.wide)
        if setup.triton_rope:
            self._use_triton_rope()
        self._bind_kv_pool(pool)

    def _specialize(self, pack_dense: bool, c_kernels: bool, wide: WideMatmul) -> None:
        """Plain matrices packed for oneDNN (`pack_dense`); block matrices' wide steps (past
        `block_rows_limit()` rows; on AMX, where the block kernel takes any number of rows in float32,
        long extends past WIDE_ROWS at a lower precision only) as `wide` says, a precision below
        float32's taking the rows of long extends only (the head, outside those, keeps every row in the
        block kernel); C per-token ops."""
        limit = block_rows_limit()
        if limit is None and wide.lower:
            limit = WIDE_ROWS
        for m in self.modules():
            if isinstance(m, BlockLinear):
                m.wide_matmul = None if limit is None else wide
        for i, layer in enumerate(self.layers):
            for path in layer_matrices(self.plan, i):
                parent, _, attr = path.rpartition(".")
                owner = layer.get_submodule(parent) if parent else layer
                if pack_dense:
                    setattr(owner, attr, _packed(getattr(owner, attr)))
            if c_kernels:
                layer.use_c_kernels()
        self.norm.in_c = c_kernels
        if pack_dense:
            self.lm_head = _packed(self.lm_head, keep_dense=self.config.tie_word_embeddings)
        if isinstance(self.lm_head, BlockLinear) and self.lm_head.long_extends_only:
            self.lm_head.wide_matmul = None  # the head's rows are logits rows, no long extend's: the block kernel's
        if any(isinstance(m, BlockLinear) and m.long_extends_only for m in self.modules()):
            self.long_extend_min, self.wide_in_c = limit, wide.in_c

    def _use_triton_rope(self) -> None:
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

    def _bind_kv_pool(self, pool: TokenToKVPool) -> None:
        """Set up the one-call C decode step over `pool` where it applies: a CPU pool of a KV dtype the
        kernels read and every layer one the C step runs (no soft-cap, no mixture of experts) on GGUF-block
        matrices (no qkv bias) with its per-token ops in C."""
        self.decode_in_c = None
        k0 = pool.k_buffer[0]
        if self.tp is not None or not DecodeLayers.available() or k0.dtype not in KV_DTYPES or k0.device.type != "cpu":
            return
        weights = []
        for i, layer in enumerate(self.layers):
            if not layer.one_call:
                return
            mats = (layer.qkv, layer.o_proj, layer.mlp.gate_up, layer.mlp.down)
            if not (layer.qkv.bias is None and all(isinstance(m, BlockLinear) for m in mats)):
                return
            out_norms = (layer.attn_out_norm, layer.mlp_out_norm)
            weights.append(LayerWeights(
                layer.input_norm.weight, layer.post_attn_norm.weight, pool.k_buffer[i], pool.v_buffer[i],
                *(m.panels for m in mats), q_norm=layer.attn.q_norm, k_norm=layer.attn.k_norm,
                attn_out_norm=None if out_norms[0] is None else out_norms[0].weight,
                mlp_out_norm=None if out_norms[1] is None else out_norms[1].weight,
                gelu=isinstance(layer.mlp.act, GeluAndMul), local=layer.attn.window is not None))
        a, mlp = self.layers[0].attn, self.layers[0].mlp
        dims = DecodeDims(a.num_heads, a.num_kv_heads, a.head_dim, mlp.down.in_features, self.config.rms_norm_eps,
                          a.scale)  # Gemma's q/k norms take the model's eps too
        limit = None if self.long_extend_min is not None else block_rows_limit()
        self.decode_in_c = DecodeLayers(weights, dims, limit or sys.maxsize)

    @property
    def rotaries(self) -> list[Rotary]:
        """The model's rotary tables: the global one, and the sliding-window layers' where they have their own."""
        return [r for r in (self.rotary, self.local_rotary) if r is not None]

    def size_positions(self, max_len: int) -> None:
        """Keep rotary tables for positions 0..max_len-1 only: the most a served sequence reaches."""
        for rotary in self.rotaries:
            rotary.resize(max_len)

    @property
    def one_call_rows(self) -> int | None:
        """Most rows of a pure-decode step that run all layers in one C call (None: no such path)."""
        return None if self.decode_in_c is None else self.decode_in_c.max_rows

    @torch.inference_mode()
    def forward(
        self,
        fb: ForwardBatch,
        pool: TokenToKVPool,
        req_to_token: torch.Tensor,
        backend: AttentionBackend,
        meta: object | None = None,
        plan: StepPlan | None = None,
    ) -> torch.Tensor:
        """Logits [L, V] (float32) of `fb.logits_indices` (and, where `fb.hidden_indices` is set, the final
        norm's output at those rows into `fb.hidden_out`); `meta`: prebuilt attention metadata (a CUDA
        graph's static one), else built from `fb`; `plan`: how the step runs (default: from `fb`)."""
        graph = meta is not None  # a captured graph replays for any lengths: its window layers always windowed
        if meta is None:
            meta = backend.init_metadata(fb, req_to_token)
        if plan is None:
            plan = plan_step(fb, self.config, self.one_call_rows, self.long_extend_min, self.wide_in_c)
        h = embed_lookup(self.embed, fb.input_ids, self.tp)  # [T, hidden]
        if self.config.embed_scale != 1.0:
            h = h * self.config.embed_scale
        call = backend.decode_step(meta) if plan.one_call else None
        last: torch.Tensor | None = None  # the rows the last layer computes on, where fewer than all
        window = self._window_keys(fb, req_to_token, backend) if call is not None else None
        if call is not None and window is not False:
            local = self.local_rotary
            fb.kernels_start()
            self.decode_in_c.run(h, fb.positions, fb.out_cache_loc, self.rotary.cos, self.rotary.sin, call.req_to_token,
                                 call.req_rows, call.seq_lens, call.shared, None if local is None else local.cos,
                                 None if local is None else local.sin, window)
        else:
            ctx = ForwardContext(fb, pool, backend, meta, self.rotary, wide=plan.wide, local_rotary=self.local_rotary)
            if self.config.attn_logit_softcap is not None:  # capped scores: torch attention, windows in the masks
                windows = {layer.attn.window for layer in self.layers}
                ctx.capped = {w: softcap.step_call(fb, req_to_token, w) for w in windows}
            elif self.window is not None and (graph or self._past_window(fb)):
                ctx.window_meta = backend.window_metadata(meta, fb, req_to_token, self.window)
            if not all(layer.attn.rope_in_c or layer.attn.triton_rope is not None for layer in self.layers):
                ctx.cos, ctx.sin = self.rotary.gather(fb.positions, h.dtype)
                if self.local_rotary is not None:
                    ctx.local_cos, ctx.local_sin = self.local_rotary.gather(fb.positions, h.dtype)
            fb.kernels_start()
            # only the logits rows leave the last layer (of the others, later steps read only the K/V it
            # stores), unless the step wants final hidden states too or its logits rows are all its rows
            if fb.hidden_indices is None and fb.logits_indices.shape[0] < h.shape[0]:
                last = fb.logits_indices
            for layer in self.layers[:-1]:
                h = layer(h, ctx)
            h = self.layers[-1](h, ctx, last)  # [L, hidden] where `last`
        if fb.hidden_indices is not None:  # embedding rows: the final norm's output, kept for the caller
            fb.hidden_out = self.norm(h.index_select(0, fb.hidden_indices)).float()  # [H, hidden]
        # the logits rows (a decode's rows are its logits rows; `last` left only those)
        if last is None and not (fb.is_decode and fb.logits_indices.shape[0] == h.shape[0]):
            h = h.index_select(0, fb.logits_indices)  # [L, hidden]
        logits = self.lm_head(self.norm(h)).float()  # [L, V]
        cap = self.config.final_logit_softcap
        return logits if cap is None else logits.div_(cap).tanh_().mul_(cap)

    def _past_window(self, fb: ForwardBatch) -> bool:
        """Whether some request of step `fb` attends past the sliding window (its layers then need the
        windowed metadata)."""
        return self.window is not None and any(p + e > self.window for p, e in zip(fb.prefix_lens, fb.extend_lens,
                                                                                  strict=True))

    def _window_keys(self, fb: ForwardBatch, req_to_token: torch.Tensor,
                     backend: AttentionBackend) -> WindowKeys | None | bool:
        """The one-call decode's keys of sliding-window layers for pure-decode step `fb`: None where no
        request is past the window (those layers read as global ones), False where the backend offers no
        one call for the windowed step."""
        if not self._past_window(fb):
            return None
        call = backend.decode_step(backend.init_metadata(fb, req_to_token, window=self.window))
        return False if call is None else WindowKeys(call.req_to_token, call.req_rows, call.seq_lens)

    def load_weights(self, ckpt: Checkpoint, blocks: bool = False) -> None:
        """Read this rank's part of the HF-named checkpoint tensors (only that part; fails loudly on
        missing names). With `blocks` (one rank, float32 CPU), every matrix the file holds quantized
        becomes a BlockLinear over its blocks, the embedding table too (a tied head shares it), and a
        16-bit one a StoredLinear: no float copy of them is made."""
        plan = self.plan
        vocab = plan.vocab_rows()
        with torch.no_grad():
            name = "model.embed_tokens.weight"
            table = pack_panels_by_rows(*ckpt.shape(name), lambda r: ckpt.quantized(name, r)) if blocks else None
            if table is not None:
                del self.embed  # the Parameter: the table stays in blocks
                self.embed: torch.Tensor | PanelWeight = table
                if self.config.tie_word_embeddings:
                    self.lm_head = BlockLinear(self.embed, None)
            else:
                _copy_rows(self.embed, ckpt.get("model.embed_tokens.weight", rows=vocab))
            offset = self.config.norm_weight_offset  # HF Gemma's norms multiply by 1 + w

            def norm(name: str) -> torch.Tensor:
                return ckpt.get(name) + offset

            self.norm.weight.copy_(norm("model.norm.weight"))
            if not self.config.tie_word_embeddings:
                head = _load_matrix(ckpt, _dense(self.lm_head), ["lm_head.weight"], vocab, None, blocks)
                if isinstance(self.lm_head, ShardedLinear):
                    self.lm_head.inner = head
                else:
                    self.lm_head = head
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{i}."
                layer.input_norm.weight.copy_(norm(p + "input_layernorm.weight"))
                if layer.attn_out_norm is None:
                    layer.post_attn_norm.weight.copy_(norm(p + "post_attention_layernorm.weight"))
                else:
                    layer.attn_out_norm.weight.copy_(norm(p + "post_attention_layernorm.weight"))
                    layer.post_attn_norm.weight.copy_(norm(p + "pre_feedforward_layernorm.weight"))
                    layer.mlp_out_norm.weight.copy_(norm(p + "post_feedforward_layernorm.weight"))
                matrices = layer_matrices(plan, i)
                if layer.qkv.bias is not None:
                    layer.qkv.bias.copy_(torch.cat([ckpt.get(p + n + ".bias", rows=r) for n, r, _ in matrices["qkv"]]))
                if layer.attn.q_norm is not None:
                    layer.attn.q_norm.copy_(norm(p + "self_attn.q_norm.weight"))
                    layer.attn.k_norm.copy_(norm(p + "self_attn.k_norm.weight"))
                for path, specs in matrices.items():
                    parent, _, attr = path.rpartition(".")
                    owner = layer.get_submodule(parent) if parent else layer
                    m = getattr(owner, attr)
                    names = [p + n + ".weight" for n, _, _ in specs]
                    rows, cols = [r for _, r, _ in specs], [c for _, _, c in specs]
                    loaded = _load_matrix(ckpt, _dense(m), names, rows, cols, blocks)
                    if isinstance(m, ShardedLinear):
                        m.inner = loaded
                    else:
                        setattr(owner, attr, loaded)


def _load_matrix(ckpt: Checkpoint, dense: DenseLinear, names: list[str], rows: list[slice | None] | slice | None,
                 cols: list[slice | None] | None, blocks: bool) -> Linear:
    """The matrix stacking checkpoint tensors `names` (each its rows and columns), with `dense`'s bias:
    over the file's blocks where `blocks` and it holds them quantized (one BlockLinear, or one per part
    where no block format holds them all), kept 16-bit where it holds them so, else copied into `dense`."""
    rows = rows if isinstance(rows, list) else [rows] * len(names)
    cols = cols or [None] * len(names)
    if blocks:
        found = [ckpt.quantized(n) for n in names]
        if all(w is not None for w in found):
            fused = concat_rows(found)
            if fused is not None:
                return BlockLinear(pack_panels(fused), dense.bias)
            return ConcatLinear([BlockLinear(pack_panels(w), None) for w in found], dense.bias)
        stored = [ckpt.stored(n) for n in names]
        if all(w is not None for w in stored):
            return StoredLinear(torch.cat(stored), dense.bias)
    parts = [ckpt.get(n, rows=r, cols=c) for n, r, c in zip(names, rows, cols, strict=True)]
    _copy_rows(dense.weight, torch.cat(parts))
    return dense


def _packed(m: Linear, keep_dense: bool = False) -> Linear:
    """A plain matrix (inside its tensor-parallel wrapper, if any) packed for oneDNN; others as they are."""
    if isinstance(m, ShardedLinear):
        m.inner = _packed(m.inner, keep_dense)
        return m
    return pack(m, keep_dense) if type(m) is DenseLinear else m


def _copy_rows(param: torch.Tensor, rows: torch.Tensor) -> None:
    """Copy `rows` into the first rows of `param`; zero the rest (a padded last vocabulary shard)."""
    param[: rows.shape[0]].copy_(rows)
    param[rows.shape[0] :].zero_()
