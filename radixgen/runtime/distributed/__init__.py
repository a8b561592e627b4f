"""Tensor parallelism on torch.distributed: one process per rank, rank 0 inside the Engine.

Rank 0 runs the scheduler and the sampler; each step it broadcasts the batch (`wire.py`) and every
rank runs the model over its shard (`models/sharding.py`, `layers/parallel.py`) with the same KV slot
indices, all-reducing after row-parallel matrices; logits are gathered on rank 0, which samples once.
`launch.py` starts the other ranks (this machine's as child processes; other machines' with
`radixgen serve --node-rank K`), `rank.py` is their main loop, `runner.py` the rank-0 ModelRunner,
`group.py` the process groups.
"""

from __future__ import annotations

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.model_runner import ModelRunner


def make_model_runner(config: EngineConfig) -> ModelRunner:
    """The engine's ModelRunner: in this process for tp_size 1, else rank 0 of a tensor-parallel group
    (which starts this machine's other ranks and waits for every rank to load)."""
    if config.dp_size > 1:
        raise ValueError(f"dp_size={config.dp_size}: data-parallel replicas are separate engine processes behind a "
                         f"router; use `radixgen serve --dp-size {config.dp_size}` (or `radixgen router --worker-urls` "
                         f"over running servers). An in-process Engine is one replica: leave dp_size at 1.")
    if config.node_rank != 0:
        raise ValueError(f"node_rank={config.node_rank} runs tensor-parallel ranks only, not an engine: start it with "
                         f"`radixgen serve --node-rank {config.node_rank} ...` (node 0 runs the Engine)")
    if config.tp_size == 1:
        return ModelRunner(config)
    from radixgen.runtime.distributed.runner import TPModelRunner  # lazy: torch.distributed

    return TPModelRunner(config)
