"""Tensor-parallel layers: row-parallel linears, the vocab-parallel embedding lookup and lm_head.

Column-parallel matrices (the fused qkv and gate_up) need no layer of their own: each rank holds
its rows (`models/sharding.py`) in any Linear representation and its outputs stay sharded (its
heads, its MLP columns). A row-parallel matrix (o_proj, down) takes those sharded inputs, so each
rank's product is a partial sum: `RowParallelLinear` wraps any representation and all-reduces it.
The vocabulary is split by rows: each rank looks up the ids it holds (zeros for the others) and the
sum over ranks is the embedding; the lm_head computes its vocabulary slice of the logits, gathered
on rank 0, the only rank that samples.

The collectives come from `Collectives` (torch.distributed in `runtime/distributed/group.py`), so
these layers do not import torch.distributed themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from radixgen.runtime.kernels.block_gemm import PanelWeight, block_dequant_rows
from radixgen.runtime.layers.linear import Linear, Runs


class Collectives(Protocol):
    """What the layers need from a tensor-parallel group."""

    rank: int
    size: int

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks in place; returns it."""

    def gather_first(self, t: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's `t` (same shape everywhere) on rank 0, in rank order; None on other ranks."""


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in a tensor-parallel group and the group's collectives."""

    rank: int
    size: int
    comm: Collectives


class ShardedLinear(Linear):
    """A Linear over this rank's shard of a matrix: `inner` (any representation, replaceable by
    `specialize`) computes the local product, the subclass adds the collective."""

    inner: Linear


class RowParallelLinear(ShardedLinear):
    """`inner` holds this rank's columns of the weight; the output [M, out] is summed over ranks."""

    def __init__(self, inner: Linear, comm: Collectives) -> None:
        super().__init__()
        if inner.bias is not None:
            raise ValueError("a row-parallel bias would be added once per rank: not supported")
        self.inner, self.comm = inner, comm
        self.in_features, self.out_features, self.bias = inner.in_features, inner.out_features, None

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        return self.comm.all_reduce(self.inner(x, wide).contiguous())  # [M, out]


class VocabParallelHead(ShardedLinear):
    """`inner` holds this rank's rows of the lm_head (padded to equal shards); rank 0 gets the logits
    [M, vocab_size], other ranks an empty [M, 0]."""

    def __init__(self, inner: Linear, comm: Collectives, vocab_size: int) -> None:
        super().__init__()
        self.inner, self.comm, self.vocab_size = inner, comm, vocab_size
        self.in_features, self.out_features, self.bias = inner.in_features, vocab_size, None

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        parts = self.comm.gather_first(self.inner(x, wide).float().contiguous())  # size x [M, Vp]
        if parts is None:
            return x.new_empty((x.shape[0], 0), dtype=torch.float32)
        return torch.cat(parts, dim=1)[:, : self.vocab_size]  # [M, V]


def embed_lookup(weight: torch.Tensor | PanelWeight, ids: torch.Tensor, tp: TensorParallel | None) -> torch.Tensor:
    """Embeddings [T, hidden] of `ids` [T] (float32 rows dequantized from a block-kernel table); under
    tensor parallelism `weight` (dense) holds this rank's vocabulary rows (rank * rows ..), the other
    rows come from the other ranks' sums."""
    if isinstance(weight, PanelWeight):
        return block_dequant_rows(weight, ids)
    if tp is None:
        return weight.index_select(0, ids)
    rows = weight.shape[0]
    local = ids - tp.rank * rows  # [T]
    inside = (local >= 0) & (local < rows)  # [T]
    h = weight.index_select(0, local.clamp(0, rows - 1))  # [T, hidden]
    h.masked_fill_(~inside[:, None], 0)
    return tp.comm.all_reduce(h)
