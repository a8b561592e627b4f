"""The Triton attention backend (GPU; CPU only under TRITON_INTERPRET=1, for tests).

The kernels (`kernels/triton_attention.py`) read K/V by slot through req_to_token with no gather
copy: an extend kernel with an online softmax, and a split-KV decode kernel merged by log-sum-exp.
Decode metadata depends only on the batch size, so decode steps can be captured as CUDA graphs.
Sliding-window layers take the same index tensors with the window set (`window_metadata`), so a
captured decode graph holds both layers' launches over the same static buffers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.layers.attention.base import AttentionBackend

NUM_KV_SPLITS = 8  # decode: each request's keys in this many parts, attended in parallel


class TritonAttention(AttentionBackend):
    name = "triton"
    supports_cuda_graph = True
    supports_sliding_window = True

    def __init__(self) -> None:
        from radixgen.runtime.kernels import triton_attention  # lazy: triton

        self.kernels = triton_attention

    def init_metadata(self, fb: ForwardBatch, req_to_token: torch.Tensor, window: int | None = None):
        return self.kernels.TritonAttentionMetadata.build(fb, req_to_token, NUM_KV_SPLITS, window)

    def window_metadata(self, meta: Any, fb: ForwardBatch, req_to_token: torch.Tensor, window: int) -> Any:
        return dataclasses.replace(meta, window=window)  # the same tensors: no second host->device copy

    def forward(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, meta,
                scale: float) -> torch.Tensor:
        return self.kernels.triton_attention(q, k_buffer, v_buffer, meta, scale)

    def graph_metadata(self, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, rows: torch.Tensor,
                       positions: torch.Tensor, seq_lens: torch.Tensor):
        # a decode token's position is its prefix length; each request has one new token at its own row
        ones = torch.ones_like(rows)
        return self.kernels.TritonAttentionMetadata(req_to_token, req_pool_indices, rows, positions, ones, seq_lens,
                                                    max_extend=1, is_decode=True, num_kv_splits=NUM_KV_SPLITS)
