"""Rank 0's ModelRunner under tensor parallelism: starts the other ranks, then drives them each step.

`forward` broadcasts the step's batch, then runs its own shard like every rank; the logits arrive
gathered (`layers/parallel.VocabParallelHead`), so the ModelWorker samples on rank 0 as it does in one
process. Any failure inside a step leaves the ranks out of lockstep, so it fails the runner for
good with a `TensorParallelError` that names the rank that went away when one did; the scheduler
then ends every request with that message and refuses new ones.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.distributed.group import TPGroup
from radixgen.runtime.distributed.launch import RankLayout, RankProcesses, free_port, rank_config
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.executor.memory_plan import available_memory, kv_bytes_per_token, plan_kv
from radixgen.runtime.executor.model_runner import DTYPES, KV_DTYPES, ModelRunner
from radixgen.runtime.executor.step_plan import StepPlan
from radixgen.runtime.layers.parallel import TensorParallel
from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.models.loader import Checkpoint, open_checkpoint
from radixgen.runtime.models.sharding import ShardPlan, check_tp_size

logger = logging.getLogger(__name__)


def shared_kv_tokens(config: EngineConfig, model_config: ModelConfig, checkpoint: Checkpoint, per_node: int) -> int:
    """The KV pool size every rank allocates (they must agree): `config.max_total_tokens`, else sized by
    mem_fraction_static for one rank's shard of the weights and KV heads, this node's memory split over
    its `per_node` ranks (estimated here, before any rank loads)."""
    if config.max_total_tokens is not None:
        return config.max_total_tokens
    device = torch.device(rank_config(config, 0).device)
    dtype = DTYPES[config.dtype]
    kv_dtype = dtype if config.kv_cache_dtype == "auto" else KV_DTYPES[config.kv_cache_dtype]
    kv_heads = ShardPlan(model_config, 0, config.tp_size).kv_heads
    context = min(config.context_length or model_config.max_position_embeddings, model_config.max_position_embeddings)
    available = available_memory(device) // (1 if device.type == "cuda" else per_node)
    return plan_kv(available, checkpoint.resident_bytes(False, dtype) // config.tp_size,
                   kv_bytes_per_token(model_config.num_layers, kv_heads, model_config.head_dim, kv_dtype),
                   config.mem_fraction_static, None, config.max_running_requests * context, "a rank's shard").kv_tokens


class TensorParallelError(RuntimeError):
    """A tensor-parallel step failed; the group cannot continue."""


class TPModelRunner(ModelRunner):
    """Rank 0 of `config.tp_size` ranks (this process), the others started here or on other nodes."""

    def __init__(self, config: EngineConfig) -> None:
        layout = RankLayout.of(config)
        model_config, checkpoint = open_checkpoint(config.model)
        check_tp_size(model_config, config.tp_size)
        config = replace(config, max_total_tokens=shared_kv_tokens(config, model_config, checkpoint, layout.per_node))
        self.addr = config.dist_init_addr or f"127.0.0.1:{free_port()}"
        self.failed: str | None = None
        self.ranks = RankProcesses(config, self.addr, layout.ranks[1:])
        self.group: TPGroup | None = None
        try:
            own = rank_config(config, 0)
            self.group = TPGroup(0, config.tp_size, self.addr, torch.device(own.device), alive=self.ranks.failure)
            error: Exception | None = None
            try:
                super().__init__(own, TensorParallel(0, config.tp_size, self.group))
            except Exception as e:  # the other ranks learn it in check_startup
                error = e
            self.group.check_startup(None if error is None else f"{type(error).__name__}: {error}")
            if error is not None:
                raise error
        except BaseException:
            self.failed = "start-up failed"
            self.close()
            raise
        logger.info("tensor parallel: %d ranks (%d nodes) at %s, local ranks %s", config.tp_size, config.nnodes,
                    self.addr, self.ranks.pids)

    def forward(self, fb: ForwardBatch, plan: StepPlan | None = None) -> torch.Tensor:
        if self.failed is not None:
            raise TensorParallelError(self.failed)
        try:
            self.group.send_batch(fb)
            return super().forward(fb, plan)
        except Exception as e:
            gone = self.ranks.failure(wait=1.0)
            self.failed = (f"{gone or f'a tensor-parallel step failed ({e})'}: the tensor-parallel group cannot "
                           f"continue; start a new engine")
            raise TensorParallelError(self.failed) from e

    def close(self) -> None:
        """Stop the other ranks and leave the group."""
        if self.group is not None and not self.group.closed:
            if self.failed is None:
                try:
                    self.group.send_stop()
                except RuntimeError:  # a rank already gone: it is ended below
                    pass
            else:
                for p in self.ranks.procs.values():
                    p.kill()
            self.group.close()
        self.ranks.stop()
