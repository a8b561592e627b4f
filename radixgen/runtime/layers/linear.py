"""Linear layers, one class per weight representation, chosen once at load.

- `DenseLinear`: a plain [out, in] weight, `F.linear` (any device and dtype; HF checkpoints load so).
- `PackedLinear`: the weight reordered once into oneDNN's blocked layout (CPU float32/bfloat16).
  `F.linear` on CPU goes to MKL's GEMM, which streams weights at about a third of the memory
  bandwidth for the skinny products of decoding; oneDNN's inner product on a prepacked weight reads
  them about twice as fast (SmolLM2-135M, all matrices, 2 threads: fp32 batch 1 54.6 -> 30.6 ms,
  batch 16 79 -> 42 ms, batch 256 573 -> 395 ms; bf16 batch 1 30.6 -> 17.4 ms).
- `BlockLinear`: a GGUF matrix in the block kernel's panels (`kernels/block_gemm.py`), the only copy
  of the weight, for float32 rows on CPU. The block kernel takes every float32 row where it has AMX tiles,
  else up to `block_rows_limit()` rows; wider inputs (prefill) run GEMMs on slices of the weight
  dequantized for that call (`wide_linear`): in float32 for whole inputs past the limit. At a lower
  precision (`WideMatmul`, from `wide_matmul_dtype`) only the rows of the step's long extends (`wide`,
  passed down by the model) take it: bfloat16 (AMX tiles that dequantize the blocks a panel at a time,
  else slices), or the block kernel itself with the activations in fewer int8 limbs (int16: two, int8:
  one; each limb fewer about halves its integer work), while decode rows and short prompts stay float32
  in the block kernel whatever the batch.
- `ConcatLinear`: GGUF matrices fused by rows (q/k/v) that no one block format holds, side by side.
- `StoredLinear`: an F16 / BF16 GGUF matrix kept in its 16-bit type, converted to float32 a slice at
  a time for each product (memory: the file's bytes).

Every representation computes x @ W^T (+ bias) for x [M, in] -> [M, out].
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.runtime.kernels import block_gemm
from radixgen.runtime.kernels.block_gemm import (
    PanelWeight,
    bf16_tiles_available,
    block_dequant_rows,
    block_linear,
    block_linear_bf16,
    use_blocks,
)


class Linear(nn.Module):
    """x [M, in] -> x @ W^T + bias [M, out]; subclasses hold the weight in one representation. `wide`: the
    rows of the step's long extends (`long_extend_runs`), which a block matrix with a lower-precision
    wide GEMM gives to it (every other representation computes all rows alike)."""

    in_features: int
    out_features: int
    bias: torch.Tensor | None

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        raise NotImplementedError


class DenseLinear(Linear):
    """A plain weight; the representation every model is loaded in."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedLinear(Linear):
    """The weight in oneDNN's blocked layout (opaque: only `forward` reads it)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)  # no batch hint
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


Runs = tuple[tuple[int, int], ...]  # a step's rows [start, end) of its long extends, sorted and disjoint


WIDE_LIMBS = {"int16": 2, "int8": 1}  # wide_matmul_dtype's integer settings: activation limbs (block_gemm.c)


@dataclass(frozen=True)
class WideMatmul:
    """How block matrices compute rows past the block kernel's row limit: GEMMs on weight slices
    dequantized to `dtype`, or (`limbs`) the block kernel with the activations in that many int8 limbs."""

    dtype: torch.dtype
    limbs: int | None = None

    @property
    def lower(self) -> bool:
        """Below float32's precision: for the rows of long extends only."""
        return self.limbs is not None or self.dtype != torch.float32

    @property
    def in_c(self) -> bool:
        """Computed by the C kernels (the block kernel's limbs, or AMX bfloat16 tiles), no torch GEMM."""
        return self.limbs is not None or (self.dtype == torch.bfloat16 and bf16_tiles_available())


def long_extend_runs(extend_lens: list[int], min_len: int) -> Runs:
    """Row ranges of the requests that extend by more than `min_len` tokens (adjacent ones merged),
    in a step whose rows are the requests' new tokens one after another."""
    starts = itertools.accumulate(extend_lens, initial=0)  # one more than the requests: the step's end
    return _merged((start, start + n) for start, n in zip(starts, extend_lens, strict=False) if n > min_len)


def runs_among(runs: Runs, rows: torch.Tensor) -> Runs:
    """`runs` (of a step's rows) as positions among the selected `rows` (ascending row indices, CPU): the
    selected rows of each run, adjacent ones merged, empty ones dropped."""
    if not runs:
        return ()
    bounds = torch.searchsorted(rows, torch.tensor([b for run in runs for b in run], dtype=rows.dtype)).tolist()
    return _merged(zip(bounds[::2], bounds[1::2], strict=True))


def _merged(spans: Iterable[tuple[int, int]]) -> Runs:
    """Ascending disjoint [start, end) spans with the empty ones dropped and adjacent ones joined."""
    runs: list[tuple[int, int]] = []
    for start, end in spans:
        if end <= start:
            continue
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((start, end))
    return tuple(runs)


# Bytes of a weight slice the wide GEMMs dequantize at a time (kept between calls: fresh pages fault slowly).
SLICE_BYTES = 8 << 20
_slices = threading.local()


def _slice_buffer(rows: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's reusable [rows, k] buffer of `dtype` for a dequantized weight slice."""
    buffers: dict[torch.dtype, torch.Tensor] = _slices.__dict__.setdefault("buffers", {})
    buf = buffers.get(dtype)
    if buf is None or buf.numel() < rows * k:
        buf = buffers[dtype] = torch.empty(rows * k, dtype=dtype)
    return buf[: rows * k].view(rows, k)


def slice_rows(k: int, dtype: torch.dtype) -> int:
    """Weight rows a wide GEMM dequantizes at a time: SLICE_BYTES' worth, a multiple of 16, at least 16."""
    return max(16, SLICE_BYTES // (k * dtype.itemsize) // 16 * 16)


def wide_linear(x: torch.Tensor, weight_rows: Callable[[int, int, torch.Tensor], torch.Tensor], n: int,
                dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, k] (float32) @ W^T -> [M, n] float32 for a weight held in another form: `weight_rows(start,
    end, buf)` writes W's rows [start, end) as `dtype` into buf [end - start, k] and returns it; each
    slice is multiplied by a dense GEMM in `dtype` (bfloat16: its products' outputs rounded to it)."""
    m, k = x.shape
    y = torch.empty((m, n), dtype=torch.float32) if out is None else out
    xd = x if x.dtype == dtype else x.to(dtype)
    step = slice_rows(k, dtype)
    for start in range(0, n, step):
        end = min(n, start + step)
        w = weight_rows(start, end, _slice_buffer(end - start, k, dtype))  # [end - start, k]
        y[:, start:end] = F.linear(xd, w)
    return y


class BlockLinear(Linear):
    """A GGUF matrix in the block kernel's panels, for float32 CPU rows. `wide_matmul` None: the block
    kernel takes every row (AMX; the head). float32: inputs of more rows than `block_rows_limit()` run
    on dequantized slices (`wide_linear`). A lower precision (`WideMatmul.lower`): only the rows of long
    extends (`wide`) take it, the block kernel computing every other row in float32's."""

    def __init__(self, panels: PanelWeight, bias: torch.Tensor | None, wide_matmul: WideMatmul | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = panels.shape
        self.panels = panels
        self.bias = bias
        self.wide_matmul = wide_matmul

    @property
    def long_extends_only(self) -> bool:
        """Whether only long extends' rows take the wide path (a precision below float32's)."""
        return self.wide_matmul is not None and self.wide_matmul.lower

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        if self.wide_matmul is None:
            return self._blocks(x)
        if not self.long_extends_only:
            return self._blocks(x) if use_blocks(x) else self._wide(x)
        runs, m = wide, x.shape[0]
        if not runs:
            return self._blocks(x)
        if runs == ((0, m),):
            return self._wide(x)
        y = torch.empty((m, self.out_features), dtype=x.dtype)
        done = 0
        for start, end in (*runs, (m, m)):
            if start > done:
                self._blocks(x[done:start], out=y[done:start])
            if end > start:
                y[start:end] = self._wide(x[start:end])
            done = end
        return y

    def _blocks(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        y = block_linear(x, self.panels, out=out)
        return y if self.bias is None else y.add_(self.bias)

    def _wide(self, x: torch.Tensor) -> torch.Tensor:
        if self.wide_matmul.limbs is not None:
            y = block_linear(x, self.panels, limbs=self.wide_matmul.limbs)
        elif self.wide_matmul.in_c:
            y = block_linear_bf16(x, self.panels)
        else:
            rows = lambda start, end, buf: block_dequant_rows(self.panels, torch.arange(start, end), buf.dtype, out=buf)
            y = wide_linear(x, rows, self.out_features, self.wide_matmul.dtype)
        return y if self.bias is None else y.add_(self.bias)


class ConcatLinear(Linear):
    """Matrices stacked by rows that no one block format holds (their outputs side by side)."""

    def __init__(self, parts: list[Linear], bias: torch.Tensor | None) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features, self.out_features = parts[0].in_features, sum(p.out_features for p in parts)
        self.bias = bias

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        y = torch.cat([p(x, wide) for p in self.parts], dim=1)  # [M, out]
        return y if self.bias is None else y.add_(self.bias)


class StoredLinear(Linear):
    """A float16 / bfloat16 [out, in] weight kept as the file holds it; float32 rows multiply float32
    slices of it converted for each call (the results float32's)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias = bias

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        rows = lambda start, end, buf: buf.copy_(self.weight[start:end])
        y = wide_linear(x, rows, self.out_features, torch.float32)
        return y if self.bias is None else y.add_(self.bias)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing applies to float32/bfloat16 weights on CPU builds that include oneDNN."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()


def can_use_blocks(device: torch.device, dtype: torch.dtype) -> bool:
    """The block kernel runs float32 on CPU where the C kernels build."""
    return device.type == "cpu" and dtype == torch.float32 and block_gemm.library() is not None


def pack(dense: DenseLinear, keep_dense: bool = False) -> PackedLinear:
    """`dense` reordered for oneDNN; the dense weight's storage is freed unless `keep_dense` (a tied head
    shares it with the embedding)."""
    packed = PackedLinear(dense.weight, dense.bias)
    if not keep_dense:
        dense.weight.data = torch.empty(0, dtype=dense.weight.dtype, device=dense.weight.device)
    return packed
