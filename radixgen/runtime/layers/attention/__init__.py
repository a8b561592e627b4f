"""Attention: the backend interface (`base`), its torch/C and Triton implementations, and the
per-layer module (`layer`) that applies rotary embeddings, stores K/V and calls the backend."""

from __future__ import annotations

import os

import torch

from radixgen.runtime.kernels import decode_attention
from radixgen.runtime.layers.attention.base import AttentionBackend
from radixgen.runtime.layers.attention.torch_backend import TorchAttention


def get_attention_backend(name: str, device: torch.device, kv_dtype: torch.dtype | None = None) -> AttentionBackend:
    """`auto` -> Triton on CUDA, torch on CPU. `torch` runs decode rows through the C kernel where it
    builds and the KV dtype allows (`kernels.decode_attention.available`); `torch-sdpa` keeps them in
    SDPA. Triton on CPU needs TRITON_INTERPRET=1 (tests)."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name in ("torch", "torch-sdpa"):
        return TorchAttention(c_decode=name == "torch" and decode_attention.available(device, kv_dtype))
    if name != "triton":
        raise ValueError(f"attention_backend={name!r} is invalid: must be auto, torch, torch-sdpa or triton")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("attention_backend='triton' needs a CUDA device (or TRITON_INTERPRET=1 on CPU, "
                         "for tests); use 'torch' on CPU")
    from radixgen.runtime.layers.attention.triton_backend import TritonAttention  # lazy: triton

    return TritonAttention()
