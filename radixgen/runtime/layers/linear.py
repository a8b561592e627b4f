"""Linear layers, one class per weight representation, chosen once at load (`specialize`).

- `DenseLinear`: a plain [out, in] weight, `F.linear` (any device and dtype; how weights load).
- `PackedLinear`: the weight reordered once into oneDNN's blocked layout (CPU float32/bfloat16).
  `F.linear` on CPU goes to MKL's GEMM, which streams weights at about a third of the memory
  bandwidth for the skinny products of decoding; oneDNN's inner product on a prepacked weight reads
  them about twice as fast (SmolLM2-135M, all matrices, 2 threads: fp32 batch 1 54.6 -> 30.6 ms,
  batch 16 79 -> 42 ms, batch 256 573 -> 395 ms; bf16 batch 1 30.6 -> 17.4 ms).
- `BlockLinear`: GGUF Q4_0/Q4_1/Q8_0 blocks in the block kernel's panels (`kernels/block_gemm.py`)
  for float32 rows on CPU: every batch size where the kernel has AMX tiles (the dense weight is then
  freed), else up to `block_rows_limit()` rows, larger inputs (prefill) going to its dense or packed fallback.

Every representation computes x @ W^T (+ bias) for x [M, in] -> [M, out].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.runtime.kernels import block_gemm
from radixgen.runtime.kernels.block_gemm import (
    BlockWeight,
    PanelWeight,
    block_linear,
    block_rows_limit,
    pack_panels,
    use_blocks,
)


class Linear(nn.Module):
    """x [M, in] -> x @ W^T + bias [M, out]; subclasses hold the weight in one representation."""

    in_features: int
    out_features: int
    bias: torch.Tensor | None


class DenseLinear(Linear):
    """A plain weight; the representation every model is loaded in."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedLinear(Linear):
    """The weight in oneDNN's blocked layout (opaque: only `forward` reads it)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)  # no batch hint
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class BlockLinear(Linear):
    """GGUF-block weights for float32 CPU batches the block kernel is faster for, `fallback` for the
    rest (None where it is faster for every batch: AMX)."""

    def __init__(self, panels: PanelWeight, fallback: Linear | None, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = panels.shape
        self.panels = panels
        self.fallback = fallback
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fallback is None or use_blocks(x):
            y = block_linear(x, self.panels)
            return y if self.bias is None else y + self.bias
        return self.fallback(x)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing applies to float32/bfloat16 weights on CPU builds that include oneDNN."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()


def can_use_blocks(device: torch.device, dtype: torch.dtype) -> bool:
    """The block kernel runs float32 on CPU where the C kernels build."""
    return device.type == "cpu" and dtype == torch.float32 and block_gemm.library() is not None


def specialize(dense: DenseLinear, blocks: BlockWeight | None, pack: bool, keep_dense: bool = False) -> Linear:
    """The representation to run `dense` in: packed for oneDNN if `pack`, wrapped with its GGUF
    `blocks` when given (alone where the block kernel takes every batch size). Packing, or blocks
    alone, free the dense weight's storage unless `keep_dense` (a tied head shares it with the embedding)."""
    blocks_only = blocks is not None and block_rows_limit() is None
    fallback: Linear | None = None if blocks_only else dense
    if pack and not blocks_only:
        fallback = PackedLinear(dense.weight, dense.bias)
    if (pack or blocks_only) and not keep_dense:
        dense.weight.data = torch.empty(0, dtype=dense.weight.dtype, device=dense.weight.device)
    return fallback if blocks is None else BlockLinear(pack_panels(blocks), fallback, dense.bias)
