"""ModelRunner: owns the model and the KV pools; turns a ForwardBatch into logits."""

from __future__ import annotations

import logging
import time

import torch

from radixgen.radix_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.cuda_graph import DEFAULT_BATCH_SIZES, DecodeGraphRunner
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.kernels import block_gemm
from radixgen.runtime.kernels import layer_ops as cpu_layer_ops
from radixgen.runtime.layers.attention import get_attention_backend
from radixgen.runtime.layers.packed_linear import can_pack
from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.models.llama import LlamaModel
from radixgen.runtime.models.loader import load_gguf_blocks, load_model_weights
from radixgen.runtime.models.resolve import resolve_model_path

logger = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """Loads weights into our LlamaModel and allocates the request-slot and KV pools."""

    def __init__(self, config: EngineConfig) -> None:
        self.engine_config = config
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.attention = get_attention_backend(config.attention_backend, self.device, self.dtype)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        t0 = time.perf_counter()
        path = resolve_model_path(config.model)
        logger.info("loading %s (%s on %s)", path, config.dtype, config.device)
        model_config, weights = load_model_weights(config.model)
        logger.info("weights loaded in %.1f s (%d tensors)", time.perf_counter() - t0, len(weights))
        self.model_config: ModelConfig = model_config
        self.context_length = min(config.context_length or model_config.max_position_embeddings,
                                  model_config.max_position_embeddings)
        model = LlamaModel(model_config, self.context_length)
        model.load_hf_weights(weights)
        del weights
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.model.rotary.float()  # keep cos/sin tables in fp32
        if can_pack(self.device, self.dtype):
            self.model.pack_weights()
        if cpu_layer_ops.available(self.device, self.dtype):
            self.model.use_fused_ops()
        if (path.suffix == ".gguf" and self.device.type == "cpu" and self.dtype == torch.float32
                and not config.disable_block_kernels and block_gemm.library() is not None):
            self.model.set_block_weights(load_gguf_blocks(path, model_config))
        logger.info("model built in %.1f s (%d layers, vocabulary %d)", time.perf_counter() - t0,
                    model_config.num_layers, model_config.vocab_size)
        mc = model_config
        self.req_to_token_pool = ReqToTokenPool(config.max_running_requests, self.context_length + 1, self.device)
        self.token_to_kv_pool = TokenToKVPool(
            config.max_total_tokens, mc.num_layers, mc.num_kv_heads, mc.head_dim, self.dtype, self.device
        )
        self.decode_graphs: DecodeGraphRunner | None = None
        if self.device.type == "cuda" and self.attention.name == "triton" and not config.disable_cuda_graph:
            sizes = tuple(s for s in DEFAULT_BATCH_SIZES if s <= config.max_running_requests)
            self.decode_graphs = DecodeGraphRunner(self, sizes, capture=True)

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Run one step; returns float32 logits [len(fb.logits_indices), V]."""
        self.req_to_token_pool.apply(fb.table_update)
        if self.decode_graphs is not None and self.decode_graphs.can_run(fb):
            return self.decode_graphs.forward(fb)
        return self.model(fb, self.token_to_kv_pool, self.req_to_token_pool.device_table, self.attention)
