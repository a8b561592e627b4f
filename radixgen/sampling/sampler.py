"""Batched sampling entry point: picks the fused Triton kernel on GPU and the torch path on CPU."""

from __future__ import annotations

import functools
from typing import Literal

import torch

from radixgen.sampling.torch_ops import SampleOutput, SamplerKernels, SamplingBatch, sample

Backend = Literal["auto", "torch", "triton"]


class Sampler:
    """`Sampler(backend, device)(logits, batch, bitmask)` -> SampleOutput.

    "auto" resolves to "triton" on CUDA devices (when Triton imports) and to "torch" elsewhere.
    "triton" on a CPU device only works under TRITON_INTERPRET=1 (the kernel tests use that).
    `kernels`: faster stand-ins for steps of the torch path (the runtime passes its C ones on CPU:
    the bitmask, the greedy argmax and the seeded draw); default torch's own.
    """

    def __init__(self, backend: Backend = "auto", device: torch.device | str = "cpu",
                 kernels: SamplerKernels | None = None) -> None:
        if backend not in ("auto", "torch", "triton"):
            raise ValueError(f"sampling backend must be 'auto', 'torch' or 'triton', got {backend!r}")
        self.device = torch.device(device)
        if backend == "auto":
            backend = "triton" if self.device.type == "cuda" and _triton_available() else "torch"
        self.backend: Literal["torch", "triton"] = backend
        if backend == "triton":
            from radixgen.sampling.triton_kernels import triton_sample  # lazy: triton is heavy

            self._impl = triton_sample
        else:
            self._impl = functools.partial(sample, kernels=kernels) if kernels is not None else sample

    def __call__(
        self, logits: torch.Tensor, batch: SamplingBatch, bitmask: torch.Tensor | None = None
    ) -> SampleOutput:
        """logits [B, V] (any float dtype; sampled in float32); bitmask int32 [B, ceil(V/32)] or None."""
        if logits.dim() != 2 or logits.shape[0] != batch.batch_size:
            raise ValueError(f"logits must be [{batch.batch_size}, V], got {tuple(logits.shape)}")
        if bitmask is not None and bitmask.dtype != torch.int32:
            raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
        if logits.dtype != torch.float32:
            logits = logits.float()
        return self._impl(logits, batch, bitmask)

    def __repr__(self) -> str:
        return f"Sampler(backend={self.backend!r}, device={str(self.device)!r})"


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
