"""Linear layers, one class per weight representation, chosen once at load (`specialize`).

- `DenseLinear`: a plain [out, in] weight, `F.linear` (any device and dtype; how weights load).
- `PackedLinear`: the weight reordered once into oneDNN's blocked layout (CPU float32/bfloat16), or a
  bfloat16 copy of a float32 weight that float32 rows run through on the CPU's bf16 dot products.
  `F.linear` on CPU goes to MKL's GEMM, which streams weights at about a third of the memory
  bandwidth for the skinny products of decoding; oneDNN's inner product on a prepacked weight reads
  them about twice as fast (SmolLM2-135M, all matrices, 2 threads: fp32 batch 1 54.6 -> 30.6 ms,
  batch 16 79 -> 42 ms, batch 256 573 -> 395 ms; bf16 batch 1 30.6 -> 17.4 ms).
- `BlockLinear`: GGUF Q4_0/Q4_1/Q8_0 blocks in the block kernel's panels (`kernels/block_gemm.py`)
  for float32 rows on CPU: every batch size where the kernel has AMX tiles (the dense weight is then
  freed), else up to `block_rows_limit()` rows, larger inputs (prefill) going to its dense or packed
  float32 fallback; or, with a bfloat16 fallback (`wide_matmul_dtype`), every row but those of the
  step's long extends (`wide_rows`), which the fallback takes: prefill ~1.5x faster on AMD Zen 4, while
  decode rows and short prompts stay float32 whatever the batch.

Every representation computes x @ W^T (+ bias) for x [M, in] -> [M, out].
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

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
    """The weight in oneDNN's blocked layout (opaque: only `forward` reads it), in `dtype` (default:
    the weight's). Rows of another dtype are converted to it for the product and the result back."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype or weight.dtype
        w = weight.detach().to(self.dtype).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)  # no batch hint
        self.bias = None if bias is None else bias.detach().to(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.dtype:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed, self.bias, "none", [], "").to(x.dtype)


# The step's rows [start, end) that belong to long extends, for the block matrices whose fallback is
# of lower precision: set by the model around its layers (`wide_rows`), empty elsewhere (the head).
_WIDE_RUNS: ContextVar[tuple[tuple[int, int], ...]] = ContextVar("wide_runs", default=())


@contextmanager
def wide_rows(runs: tuple[tuple[int, int], ...]) -> Iterator[None]:
    """Within the block, lower-precision fallbacks take the rows in `runs` (sorted, disjoint)."""
    token = _WIDE_RUNS.set(runs)
    try:
        yield
    finally:
        _WIDE_RUNS.reset(token)


def long_extend_runs(extend_lens: list[int], min_len: int) -> tuple[tuple[int, int], ...]:
    """Row ranges of the requests that extend by more than `min_len` tokens (adjacent ones merged),
    in a step whose rows are the requests' new tokens one after another."""
    runs: list[tuple[int, int]] = []
    start = 0
    for n in extend_lens:
        if n > min_len:
            if runs and runs[-1][1] == start:
                runs[-1] = (runs[-1][0], start + n)
            else:
                runs.append((start, start + n))
        start += n
    return tuple(runs)


class BlockLinear(Linear):
    """GGUF-block weights for float32 CPU rows, with a `fallback` (None where the block kernel is the
    fastest for every batch: AMX). A float32 fallback takes whole inputs of more rows than
    `block_rows_limit()`; a lower-precision one (`long_extends_only`) only the rows of long extends
    (`wide_rows`), the block kernel computing every other row."""

    def __init__(self, panels: PanelWeight, fallback: Linear | None, bias: torch.Tensor | None,
                 long_extends_only: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = panels.shape
        self.panels = panels
        self.fallback = fallback
        self.bias = bias
        self.long_extends_only = long_extends_only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fallback is None:
            return self._blocks(x)
        if not self.long_extends_only:
            return self._blocks(x) if use_blocks(x) else self.fallback(x)
        runs, m = _WIDE_RUNS.get(), x.shape[0]
        if not runs:
            return self._blocks(x)
        if runs == ((0, m),):
            return self.fallback(x)
        y = torch.empty((m, self.out_features), dtype=x.dtype)
        done = 0
        for start, end in (*runs, (m, m)):
            if start > done:
                self._blocks(x[done:start], out=y[done:start])
            if end > start:
                y[start:end] = self.fallback(x[start:end])
            done = end
        return y

    def _blocks(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        y = block_linear(x, self.panels, out=out)
        return y if self.bias is None else y.add_(self.bias)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing applies to float32/bfloat16 weights on CPU builds that include oneDNN."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()


def can_use_blocks(device: torch.device, dtype: torch.dtype) -> bool:
    """The block kernel runs float32 on CPU where the C kernels build."""
    return device.type == "cpu" and dtype == torch.float32 and block_gemm.library() is not None


def specialize(dense: DenseLinear, blocks: BlockWeight | None, pack: bool, keep_dense: bool = False,
               wide_dtype: torch.dtype | None = None) -> Linear:
    """The representation to run `dense` in: packed for oneDNN if `pack`, wrapped with its GGUF
    `blocks` when given (alone where the block kernel takes every batch size; else with a packed
    fallback in `wide_dtype`, default the weight's: a lower precision one takes long extends only).
    Packing, or blocks alone, free the dense weight's storage unless `keep_dense` (a tied head shares
    it with the embedding)."""
    blocks_only = blocks is not None and block_rows_limit() is None
    fallback: Linear | None = None if blocks_only else dense
    lower = blocks is not None and pack and wide_dtype is not None and wide_dtype != dense.weight.dtype
    if pack and not blocks_only:
        fallback = PackedLinear(dense.weight, dense.bias, wide_dtype if lower else None)
    if (pack or blocks_only) and not keep_dense:
        dense.weight.data = torch.empty(0, dtype=dense.weight.dtype, device=dense.weight.device)
    return fallback if blocks is None else BlockLinear(pack_panels(blocks), fallback, dense.bias, lower)
