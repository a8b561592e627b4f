"""ModelRunner: owns the model and the KV pools; turns a ForwardBatch into logits.

Under tensor parallelism every rank has one over its shard (`tp`): its KV heads in the pool, dense
matrices (no GGUF blocks), no CUDA graphs; `runtime/distributed/` drives the ranks in lockstep.
"""

from __future__ import annotations

import logging
import time

import torch

from radixgen.common.heap import release_free_memory
from radixgen.radix_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.cuda_graph import DEFAULT_BATCH_SIZES, DecodeGraphRunner
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.executor.memory_plan import available_memory, kv_bytes_per_token, plan_kv
from radixgen.runtime.executor.step_plan import StepPlan, plan_step
from radixgen.runtime.kernels import extend_attention as c_extend
from radixgen.runtime.kernels import ffi, layer_ops
from radixgen.runtime.kernels.block_gemm import bf16_tiles_available, block_rows_limit
from radixgen.runtime.kernels.build import cpu_flags
from radixgen.runtime.layers.attention import get_attention_backend
from radixgen.runtime.layers.linear import WIDE_LIMBS, WideMatmul, can_pack, can_use_blocks
from radixgen.runtime.layers.parallel import TensorParallel
from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.models.llama import LlamaModel, RunSetup
from radixgen.runtime.models.loader import open_checkpoint
from radixgen.runtime.models.resolve import resolve_model_path

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_DTYPES = {**DTYPES, "int8": torch.int8}  # int8: rows with scales (radix_cache/kv_quant.py)


def wide_matmul(setting: str, attention_in_c: bool = True) -> WideMatmul:
    """How wide steps run a GGUF model's matrices (`EngineConfig.wide_matmul_dtype`): auto is bfloat16
    where AMX bfloat16 tiles compute it in C (`block_linear_bf16`: no per-block epilogue, so several
    times the integer tiles' rate at prompt widths), else int16 (two activation limbs in the block kernel)
    where the CPU has int8 dot products and long chunks attend in C (`attention_in_c`), else bfloat16
    where it has bf16 dot products, else float32. (Where their attention runs in torch, its parallel ops
    and the kernels' threads contend for the cores: Gemma 3's sliding-window layers, when they attended
    in torch, made a 1,024-token prefill 0.67x the bfloat16 path's.)"""
    if setting == "auto":
        flags = cpu_flags()
        setting = ("bfloat16" if bf16_tiles_available()
                   else "int16" if attention_in_c and {"avx512_vnni", "avx_vnni", "asimddp"} & flags
                   else "bfloat16" if {"avx512_bf16", "amx_bf16"} & flags else "float32")
    if setting in WIDE_LIMBS:
        return WideMatmul(torch.float32, WIDE_LIMBS[setting])
    return WideMatmul(DTYPES[setting])


class ModelRunner:
    """Loads weights into our LlamaModel, picks its representations for the device, and allocates
    the request-slot and KV pools."""

    def __init__(self, config: EngineConfig, tp: TensorParallel | None = None) -> None:
        self.engine_config = config
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.kv_dtype = self.dtype if config.kv_cache_dtype == "auto" else KV_DTYPES[config.kv_cache_dtype]
        if self.device.type != "cpu" and self.kv_dtype != self.dtype:
            raise ValueError(f"kv_cache_dtype={config.kv_cache_dtype!r} differs from dtype={config.dtype!r}: "
                             "only the CPU kernels read another KV dtype; use kv_cache_dtype='auto' on GPU")
        self.attention = get_attention_backend(config.attention_backend, self.device, self.kv_dtype)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        ffi.set_kernel_threads(torch.get_num_threads())  # also for threads whose torch ops run serially
        t0 = time.perf_counter()
        path = resolve_model_path(config.model)
        logger.info("loading %s (%s on %s)", path, config.dtype, config.device)
        model_config, checkpoint = open_checkpoint(config.model)
        self.model_config: ModelConfig = model_config
        if model_config.sliding_window is not None and not self.attention.supports_sliding_window:
            raise ValueError(f"{path.name} has sliding-window attention layers, which the {self.attention.name} "
                             "attention backend does not run; use attention_backend='torch'")
        self.context_length = min(config.context_length or model_config.max_position_embeddings,
                                  model_config.max_position_embeddings)
        blocks = tp is None and not config.disable_block_kernels and can_use_blocks(self.device, self.dtype)
        ranks = tp.size if tp is not None else 1
        model = LlamaModel(model_config, self.context_length, tp)
        self.memory = plan_kv(
            available_memory(self.device), checkpoint.resident_bytes(blocks, self.dtype) // ranks,
            kv_bytes_per_token(model_config.num_layers, model.plan.kv_heads, model_config.head_dim, self.kv_dtype),
            config.mem_fraction_static, config.max_total_tokens, config.max_running_requests * self.context_length,
            path.name)
        # no position reaches past the KV pool (a longer sequence is aborted), so tables for more are dead weight
        model.size_positions(min(self.context_length, self.memory.kv_tokens + 1))
        model.load_weights(checkpoint, blocks=blocks)
        del checkpoint
        release_free_memory()  # what converting the weights freed, before the KV pool adds to the peak
        logger.info("weights loaded in %.1f s", time.perf_counter() - t0)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        for rotary in self.model.rotaries:  # keep cos/sin tables in fp32
            rotary.float()
        has_blocks = self.model.block_weight_count > 0
        attn = self.model.layers[0].attn  # long chunks attend in C: bfloat16 kernel, uncapped scores
        long_attention_c = (model_config.attn_logit_softcap is None and getattr(self.attention, "c_decode", False)
                            and c_extend.available(self.kv_dtype, attn.num_heads, attn.num_kv_heads, attn.head_dim))
        wide = wide_matmul(config.wide_matmul_dtype, long_attention_c) if has_blocks else WideMatmul(torch.float32)
        mc = model_config
        self.req_to_token_pool = ReqToTokenPool(config.max_running_requests, self.context_length + 1, self.device)
        self.token_to_kv_pool = TokenToKVPool(
            self.memory.kv_tokens, mc.num_layers, self.model.plan.kv_heads, mc.head_dim, self.kv_dtype, self.device
        )
        setup = RunSetup(pack_dense=can_pack(self.device, self.dtype),
                         c_kernels=layer_ops.available(self.device, self.dtype), wide=wide,
                         triton_rope=self.attention.name == "triton")
        self.model.prepare(setup, self.token_to_kv_pool)
        logger.info("model built in %.1f s (%d layers, vocabulary %d)", time.perf_counter() - t0,
                    model_config.num_layers, model_config.vocab_size)
        self.decode_graphs: DecodeGraphRunner | None = None
        if (self.device.type == "cuda" and tp is None and self.attention.supports_cuda_graph
                and not config.disable_cuda_graph and model_config.attn_logit_softcap is None):  # capped: step masks
            sizes = tuple(s for s in DEFAULT_BATCH_SIZES if s <= config.max_running_requests)
            self.decode_graphs = DecodeGraphRunner(self.model, self.token_to_kv_pool, self.req_to_token_pool,
                                                   self.attention, sizes, capture=True)
        long = self.model.long_extend_min  # long prompt chunks' attention in bfloat16 too, where the CPU has it
        bf16_attention = long is not None and self.attention.use_bf16_long_extends(
            long, self.kv_dtype, attn.num_heads, attn.num_kv_heads, attn.head_dim)
        self.long_attention_in_c = bf16_attention and long_attention_c  # (soft-capped layers attend in torch)
        limit = long or (block_rows_limit() if has_blocks else None)  # (on AMX: long chunks' only)
        wide_text = (f"{8 * wide.limbs}-bit activations in the block kernel" if wide.limbs is not None
                     else "bfloat16 AMX tiles" if wide.in_c
                     else f"{str(wide.dtype).removeprefix('torch.')} oneDNN, sliced")
        wide_rule = f"prompt chunks past {limit} tokens" if long else f"steps past {limit} rows"
        logger.info("paths: %s %s (KV %s) on %s, attention %s, C kernels %s, %d block-weight matrices%s, one-call C "
                    "decode %s, CUDA graphs %s", model_config.arch, config.dtype,
                    str(self.kv_dtype).removeprefix("torch."), self.device, self.attention.name,
                    ffi.simd_path() if self.device.type == "cpu" else "unused", self.model.block_weight_count,
                    "" if limit is None else f" ({wide_rule}: {wide_text}"
                    f"{', attention bfloat16 C' if bf16_attention else ''})",
                    "on" if self.model.decode_in_c is not None else "off",
                    "on" if self.decode_graphs is not None else "off")

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def plan(self, fb: ForwardBatch) -> StepPlan:
        """How step `fb` runs (executor/step_plan.py)."""
        m = self.model
        return plan_step(fb, self.model_config, m.one_call_rows, m.long_extend_min, m.wide_in_c,
                         self.long_attention_in_c)

    def forward(self, fb: ForwardBatch, plan: StepPlan | None = None) -> torch.Tensor:
        """Run one step (as `plan` says; default: `self.plan(fb)`); returns float32 logits
        [len(fb.logits_indices), V] (and sets `fb.hidden_out` where `fb.hidden_indices` asks for it)."""
        self.req_to_token_pool.apply(fb.table_update)
        if self.decode_graphs is not None and fb.hidden_indices is None and self.decode_graphs.can_run(fb):
            return self.decode_graphs.forward(fb)
        return self.model(fb, self.token_to_kv_pool, self.req_to_token_pool.device_table, self.attention,
                          plan=plan or self.plan(fb))

    def close(self) -> None:
        """Release what outlives the engine's threads (nothing in one process; the ranks under TP)."""
