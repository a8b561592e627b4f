"""The attention backend interface: per-step metadata once, then one call per layer.

A backend attends each request's new queries causally to its cached prefix plus its new tokens,
reading K/V by slot through `req_to_token` (the new tokens' K/V are already stored). Backends:
torch (SDPA, with decode rows in our C kernel on CPU: `torch_backend.py`) and Triton (GPU:
`triton_backend.py`). Sliding-window layers (`supports_sliding_window` backends) attend through a
second metadata built with `window`: each query sees only the `window` latest keys up to itself.
Three optional capabilities:
- `decode_step(meta)`: a backend that can hand a whole pure-decode step to the model's one-call C
  decode (`kernels/decode_layers.py`) returns that step's decode call; others return None.
- `use_bf16_long_extends(min_len, kv_dtype, heads, kv_heads, head_dim)`: attend requests extending
  by more than `min_len` tokens in bfloat16 (the model runs their GEMMs so); True if the backend will.
- CUDA graphs: `supports_cuda_graph` backends build decode metadata over static buffers
  (`graph_metadata`), which a captured graph replays (`executor/cuda_graph.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from radixgen.runtime.executor.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    """One attention implementation for one device and KV dtype."""

    name: str
    supports_cuda_graph: bool = False
    supports_sliding_window: bool = False

    @abstractmethod
    def init_metadata(self, fb: ForwardBatch, req_to_token: torch.Tensor, window: int | None = None) -> Any:
        """Index tensors for one step, shared by every layer (with `window`: by the sliding-window
        layers of that window, each query attending to its `window` latest keys, itself included)."""

    def window_metadata(self, meta: Any, fb: ForwardBatch, req_to_token: torch.Tensor, window: int) -> Any:
        """The sliding-window layers' metadata for the step whose metadata is `meta`."""
        return self.init_metadata(fb, req_to_token, window=window)

    @abstractmethod
    def forward(self, q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, meta: Any,
                scale: float) -> torch.Tensor:
        """q [T, H, D], k/v buffers [N, Hkv, D] -> attention output [T, H * D] in q's dtype."""

    def decode_step(self, meta: Any) -> Any | None:
        """The step's single decode call when the model may run the whole step in one C call."""
        return None

    def use_bf16_long_extends(self, min_len: int, kv_dtype: torch.dtype, heads: int, kv_heads: int,
                              head_dim: int) -> bool:
        """Attend requests extending by more than `min_len` tokens in bfloat16 from now on, if this
        backend can for `kv_dtype` and this attention shape (returns whether it will)."""
        return False

    def graph_metadata(self, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, rows: torch.Tensor,
                       positions: torch.Tensor, seq_lens: torch.Tensor) -> Any:
        """Decode metadata over static [bs] buffers, for CUDA-graph capture (see `supports_cuda_graph`)."""
        raise NotImplementedError(f"the {self.name} attention backend does not capture CUDA graphs")
