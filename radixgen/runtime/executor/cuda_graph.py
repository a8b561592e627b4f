"""DecodeGraphRunner: the decode forward captured as CUDA graphs, one per padded batch size.

A decode step of a small model is a few hundred short kernels; launching them from Python costs more
than running them. The runner captures the whole forward (embedding to logits) once per batch size
in `batch_sizes` over static input buffers, then each step copies its inputs into the buffers, pads
the batch to the next captured size and replays the graph. Padding rows decode token 0 at position 0
of request row 0, write their K/V to the pool's padding slot 0 and are sliced off the logits.

Only backends that support it are captured (`AttentionBackend.supports_cuda_graph`: Triton): their
decode metadata is a few device tensors (static buffers here, from `graph_metadata`) and their kernel
grids depend only on the batch size. Without capture (CPU), the same static-buffer path runs
eagerly, which is how the padding and metadata logic is tested on CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from radixgen.radix_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.layers.attention.base import AttentionBackend

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


class DecodeGraphRunner:
    """Replays captured decode forwards for batches of at most `max(batch_sizes)` decode rows."""

    def __init__(self, model: nn.Module, pool: TokenToKVPool, req_to_token_pool: ReqToTokenPool,
                 backend: AttentionBackend, batch_sizes: tuple[int, ...], capture: bool) -> None:
        if not backend.supports_cuda_graph:
            raise ValueError(f"decode graphs need an attention backend that supports them, not {backend.name}")
        self.model, self.pool, self.backend = model, pool, backend
        self.req_to_token = req_to_token_pool.device_table
        self.batch_sizes = sorted(batch_sizes)
        self.max_bs = self.batch_sizes[-1]
        dev = self.req_to_token.device
        new = lambda: torch.zeros(self.max_bs, dtype=torch.int64, device=dev)  # noqa: E731
        self.input_ids, self.positions, self.out_cache_loc, self.req_pool_indices = new(), new(), new(), new()
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int64, device=dev)  # [max_bs]
        self.rows = torch.arange(self.max_bs, dtype=torch.int64, device=dev)  # [max_bs] logits rows / qo_start
        self._meta = {bs: backend.graph_metadata(self.req_to_token, self.req_pool_indices[:bs], self.rows[:bs],
                                                 self.positions[:bs], self.seq_lens[:bs])
                      for bs in self.batch_sizes}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            self._capture()

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:bs], positions=self.positions[:bs], out_cache_loc=self.out_cache_loc[:bs],
            req_pool_indices=self.req_pool_indices[:bs], prefix_lens=[0] * bs, extend_lens=[1] * bs,
            logits_indices=self.rows[:bs],
        )

    def _run(self, bs: int) -> torch.Tensor:  # [bs, V] float32
        return self.model(self._static_batch(bs), self.pool, self.req_to_token, self.backend, self._meta[bs])

    def _capture(self) -> None:
        pool = None
        for bs in reversed(self.batch_sizes):  # largest first: smaller graphs reuse its memory pool
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: compiles the Triton kernels outside the capture
                self._run(bs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._run(bs)
            pool = graph.pool()
            self.graphs[bs] = (graph, out)

    def can_run(self, fb: ForwardBatch) -> bool:
        """Pure decode, one logits row per request, and a batch no larger than the largest graph."""
        return fb.is_decode and fb.batch_size <= self.max_bs and fb.logits_indices.shape[0] == fb.batch_size

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits [B, V] (float32) of a decode batch, through the padded static buffers."""
        b = fb.batch_size
        bs = next(s for s in self.batch_sizes if s >= b)
        self.input_ids[:b].copy_(fb.input_ids)
        self.positions[:b].copy_(fb.positions)
        self.out_cache_loc[:b].copy_(fb.out_cache_loc)
        self.req_pool_indices[:b].copy_(fb.req_pool_indices)
        if bs > b:  # padding rows: token 0 at position 0 of row 0, K/V into the padding slot
            for buf in (self.input_ids, self.positions, self.out_cache_loc, self.req_pool_indices):
                buf[b:bs].zero_()
        torch.add(self.positions[:bs], 1, out=self.seq_lens[:bs])  # a decode token's sequence ends with it
        if bs in self.graphs:
            graph, out = self.graphs[bs]
            graph.replay()
        else:
            out = self._run(bs)
        return out[:b]
