"""Rank 0's ModelRunner under tensor parallelism: starts the other ranks, then drives them each step.

`forward` broadcasts the step's batch, then runs its own shard like every rank; the logits arrive
gathered (`layers/parallel.VocabParallelHead`), so the ModelWorker samples on rank 0 as it does in one
process. Any failure inside a step leaves the ranks out of lockstep, so it fails the runner for
good with a `TensorParallelError` that names the rank that went away when one did; the scheduler
then ends every request with that message and refuses new ones.
"""

from __future__ import annotations

import logging

import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.distributed.group import TPGroup
from radixgen.runtime.distributed.launch import RankLayout, RankProcesses, free_port, rank_config
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.layers.parallel import TensorParallel
from radixgen.runtime.models.loader import open_checkpoint
from radixgen.runtime.models.sharding import check_tp_size

logger = logging.getLogger(__name__)


class TensorParallelError(RuntimeError):
    """A tensor-parallel step failed; the group cannot continue."""


class TPModelRunner(ModelRunner):
    """Rank 0 of `config.tp_size` ranks (this process), the others started here or on other nodes."""

    def __init__(self, config: EngineConfig) -> None:
        layout = RankLayout.of(config)
        model_config, _ = open_checkpoint(config.model)
        check_tp_size(model_config, config.tp_size)
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

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.failed is not None:
            raise TensorParallelError(self.failed)
        try:
            self.group.send_batch(fb)
            return super().forward(fb)
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
