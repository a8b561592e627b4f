"""RMSNorm, SiLU-and-multiply and GELU-and-multiply (Gemma's GeGLU), each in torch or in C
(`kernels/layer_ops.py`), chosen at load.

In torch each is several ops (an RMSNorm alone is pow, mean, add, rsqrt, mul, mul), and at decode
batch sizes every op costs its dispatch, not its arithmetic; the C versions (CPU, float32) do the
same math in one call. `RMSNorm.add` fuses the residual add before the norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.runtime.kernels import layer_ops


class RMSNorm(nn.Module):
    """x [T, n] -> x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.in_c = False  # set by `DecoderLayer.use_c_kernels` (LlamaModel.prepare)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_c:
            return layer_ops.add_rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, its norm); in C, x is updated in place."""
        if self.in_c:
            return x, layer_ops.add_rms_norm(x, self.weight, self.eps, delta=delta)
        x = x + delta
        return x, self.forward(x)


class SiluAndMul(nn.Module):
    """[T, 2 I] = [gate | up] -> silu(gate) * up [T, I]."""

    def __init__(self) -> None:
        super().__init__()
        self.in_c = False  # set by `DecoderLayer.use_c_kernels` (LlamaModel.prepare)

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.in_c:
            return layer_ops.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluAndMul(nn.Module):
    """[T, 2 I] = [gate | up] -> gelu_tanh(gate) * up [T, I] (GeGLU, the tanh approximation of GELU)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_c = False  # set by `DecoderLayer.use_c_kernels` (LlamaModel.prepare)

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.in_c:
            return layer_ops.gelu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh").mul_(up)
