"""GEMMs on weights kept in GGUF's 32-weight blocks (Q4_0, Q4_1, Q8_0), for CPU decoding.

A decode step multiplies a handful of activation rows by every weight matrix. A Q4_1 matrix
dequantized to float32 is 4 bytes a weight; kept in its blocks (fp16 scales) it is 0.625.
`csrc/block_gemm.c` reads the blocks repacked into panels of 16 output rows (`pack_panels`) and
multiplies them by integer dot products with the activations split into three int8 limbs (24
bits: float32's precision; the results match a float32 GEMM on the gguf-dequantized weights to
~1e-7 relative). Widening each weight to float32 instead, as this kernel did before, cost ~5x the
vector instructions: on SmolLM2-135M (one thread, CPU time, Xeon with AVX512-VNNI) one decode row
through the 210 layer matrices took 15.5 ms that way and takes 9.3 ms now, the Q8_0 head 5.3 -> 3.1
ms, where the weights' streaming from memory is the bound. `use_blocks` routes up to `block_rows_limit()`
rows here (BLOCK_MAX_ROWS, or WIDE_ROWS where a start-up probe finds the kernel computing about as fast
as float32 FMAs; any number on AMX). Each output sums its products in one order whatever the row
count, so within that range a request's logits do not depend on its batch-mates.

The C file is built on first use (`ffi.library()` is None if that fails, and the model then runs
dense GEMMs only).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from radixgen.runtime.kernels import ffi
from radixgen.runtime.threads import on_short_lived_thread, serial_torch_on_this_thread

logger = logging.getLogger(__name__)

BLOCK = 32  # weights per block
BLOCK_MAX_ROWS = 20  # rows up to which the block kernel's vector paths beat the dense GEMM on every CPU measured
PANEL = 16  # output rows per panel (csrc/block_gemm.c)
# bytes per block in the GGUF file: fp16 d (+ fp16 m for Q4_1) + packed integers
GGUF_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


@dataclass
class BlockWeight:
    """A [n, k] weight in 32-weight blocks. bits 4: qs uint8 [n, k/2] (low nibble = weight j,
    high = weight j + 16 of each block), W = scale * q + minv. bits 8: qs int8 [n, k], W = scale * q."""

    bits: int
    qs: torch.Tensor
    scale: torch.Tensor  # [n, k/32] float32
    minv: torch.Tensor | None  # [n, k/32] float32 (4-bit only)

    @property
    def shape(self) -> tuple[int, int]:
        return self.scale.shape[0], self.scale.shape[1] * BLOCK

    def rows(self, index: torch.Tensor) -> BlockWeight:
        """The weight with its rows reordered/selected by `index` ([n'] int64)."""
        pick = lambda t: None if t is None else t.index_select(0, index).contiguous()
        return BlockWeight(self.bits, pick(self.qs), pick(self.scale), pick(self.minv))

    def dequantize(self) -> torch.Tensor:
        """The float32 [n, k] matrix (for tests and checks)."""
        n, k = self.shape
        if self.bits == 8:
            q = self.qs.float().view(n, k // BLOCK, BLOCK)
            return (q * self.scale[..., None]).view(n, k)
        packed = self.qs.view(n, k // BLOCK, BLOCK // 2)
        q = torch.cat([packed & 15, packed >> 4], dim=-1).float()  # [n, k/32, 32]
        return (q * self.scale[..., None] + self.minv[..., None]).view(n, k)


def from_gguf(data: np.ndarray, qtype: str) -> BlockWeight:
    """A GGUF tensor's raw bytes (uint8 [n, bytes per row]) of type Q4_0, Q4_1 or Q8_0."""
    if qtype not in GGUF_BLOCK_BYTES:
        raise ValueError(f"no block kernel for GGUF type {qtype} (have {', '.join(GGUF_BLOCK_BYTES)})")
    size = GGUF_BLOCK_BYTES[qtype]
    n = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(n, -1, size)  # [n, k/32, bytes]
    scale = torch.from_numpy(blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))  # [n, k/32]
    if qtype == "Q8_0":
        qs = torch.from_numpy(blocks[..., 2:].copy().view(np.int8).reshape(n, -1))
        return BlockWeight(8, qs, scale, None)
    if qtype == "Q4_1":
        minv = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
        qs = torch.from_numpy(blocks[..., 4:].copy().reshape(n, -1))
    else:  # Q4_0: W = d * (q - 8) = d * q - 8 d, both terms exact in float32
        minv = -8.0 * scale
        qs = torch.from_numpy(blocks[..., 2:].copy().reshape(n, -1))
    return BlockWeight(4, qs, scale, minv)


@dataclass
class PanelWeight:
    """A BlockWeight repacked for the kernel: rows padded to a multiple of 16 and grouped in panels
    of 16; in each block, 4 consecutive weights of the 16 rows form one 64-byte vector (see
    csrc/block_gemm.c). bits 4: qs uint8 [P, k/32, 4, 16, 4] (GGUF's block bytes: low nibble weight
    4g + t, high nibble 16 + 4g + t); bits 8: qs int8 [P, k/32, 8, 16, 4]; scale, minv float16
    [P, k/32, 16] (GGUF stores them in fp16, so this is exact)."""

    bits: int
    n: int  # rows of the weight (the padding rows are zeros)
    qs: torch.Tensor
    scale: torch.Tensor
    minv: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.scale.shape[1] * BLOCK

    @functools.cached_property
    def struct(self) -> ffi.BlockWeightC:
        """The C view (rg_block_weight) of these tensors (built once; they must not be replaced)."""
        minv = self.minv.data_ptr() if self.minv is not None else None
        return ffi.BlockWeightC(self.bits, self.qs.data_ptr(), self.scale.data_ptr(), minv)


def _half(t: torch.Tensor, what: str) -> torch.Tensor:
    """float32 -> float16, which must be exact (GGUF's scales are fp16; Q4_0's min is -8 d)."""
    h = t.to(torch.float16)
    if not torch.equal(h.float(), t):
        raise ValueError(f"block {what} values are not exactly representable in float16")
    return h


def pack_panels(w: BlockWeight) -> PanelWeight:
    """`w` in the kernel's panel layout (a copy; `w` is unchanged)."""
    n, k = w.shape
    nb, pad = k // BLOCK, -n % PANEL
    panels = (n + pad) // PANEL

    def panel_major(t: torch.Tensor | None, groups: int, width: int) -> torch.Tensor | None:
        """[n, nb * groups * width] -> [P, nb, groups, 16, width]."""
        if t is None:
            return None
        t = torch.cat([t.reshape(n, nb, groups, width), t.new_zeros(pad, nb, groups, width)])
        return t.view(panels, PANEL, nb, groups, width).permute(0, 2, 3, 1, 4).contiguous()

    groups = 4 if w.bits == 4 else 8  # 64-byte vectors per block
    qs = panel_major(w.qs, groups, 4)
    scale = panel_major(_half(w.scale, "scale"), 1, 1)[:, :, 0, :, 0]  # [P, nb, 16]
    minv = None if w.minv is None else panel_major(_half(w.minv, "min"), 1, 1)[:, :, 0, :, 0].contiguous()
    return PanelWeight(w.bits, n, qs, scale.contiguous(), minv)


def concat_rows(parts: list[BlockWeight]) -> BlockWeight | None:
    """Stack weights along rows (fused q/k/v or gate/up); None if their formats differ."""
    if len({(p.bits, p.shape[1]) for p in parts}) != 1:
        return None
    cat = lambda ts: None if ts[0] is None else torch.cat(ts)
    return BlockWeight(parts[0].bits, cat([p.qs for p in parts]), cat([p.scale for p in parts]),
                       cat([p.minv for p in parts]))


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None if no compiler can build them."""
    return ffi.library()


WIDE_ROWS = 64  # rows the block kernel takes where its vector path computes about as fast as float32 FMAs
PROBE_SHAPE = (1536, 576)  # [n, k] of the Q4_1 weight the start-up comparison times (SmolLM2's MLP)
# Per row, the block kernel's time over oneDNN's float32 GEMM on one thread (compute alone: the probe's
# weight stays in cache) up to which the kernel takes WIDE_ROWS rows: in a model the float32 weights
# stream 4 bytes each from memory, the blocks 0.6. SmolLM2's matrices on AMD Zen 4 (AVX-512 on 256-bit
# units), 2 threads, block / dense ms: 16 rows 20-32 / 36-45, 32 rows 32-39 / 43-50, 64 rows 63-66 / 75,
# 128 rows 136-146 / 136-146 (the probe: ~1.0). Intel's server cores run float32 FMAs at twice Zen 4's
# rate per cycle, the kernel's int8 dot products at the same.
WIDE_SLOWDOWN_ALLOWED = 1.25


def block_over_dense_time(lib: ctypes.CDLL, rows: int = WIDE_ROWS, reps: int = 5) -> float:
    """The block kernel's vector-path time over oneDNN's float32 GEMM on a prepacked weight (MKL's where
    oneDNN is missing) to multiply `rows` activation rows by a PROBE_SHAPE Q4_1 weight on this CPU: one
    thread each (no thread pool in the timing), best of `reps` after a warm-up."""
    n, k = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    scale = (torch.rand(n, k // BLOCK, generator=gen) / 64).half().float()
    w = BlockWeight(4, torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen), scale, -8 * scale)
    panels = pack_panels(w)
    x, y = torch.randn(rows, k, generator=gen), torch.empty(rows, n)

    def block() -> None:
        lib.block_gemm(ctypes.byref(panels.struct), x.data_ptr(), rows, k, n, y.data_ptr(), 1)

    if torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(w.dequantize(), None)
        dense = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    else:
        weight = w.dequantize()
        dense = lambda: torch.nn.functional.linear(x, weight)

    def best(run: Callable[[], object]) -> float:
        run()  # untimed: first touches of scratch buffers, oneDNN's primitive cache
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return min(times)

    def timed() -> float:
        serial_torch_on_this_thread()
        return best(block) / best(dense)

    return on_short_lived_thread(timed)


@functools.cache
def block_rows_limit() -> int | None:
    """Most activation rows for which the block kernel beats a dense float32 GEMM: None (any number)
    where it runs on AMX tiles from `block_gemm_amx_rows()` rows on; WIDE_ROWS where its vector path
    computes within WIDE_SLOWDOWN_ALLOWED of float32 FMAs (`block_over_dense_time`, timed once); else
    BLOCK_MAX_ROWS."""
    lib = library()
    if lib is None:
        return BLOCK_MAX_ROWS
    if lib.block_gemm_amx_rows() > 0:
        return None
    ratio = block_over_dense_time(lib)
    limit = WIDE_ROWS if ratio <= WIDE_SLOWDOWN_ALLOWED else BLOCK_MAX_ROWS
    logger.info("block kernel / float32 GEMM time per row on this CPU: %.2f; block kernel up to %d rows",
                ratio, limit)
    return limit


def use_blocks(x: torch.Tensor) -> bool:
    """Whether `block_linear` is the faster choice for activations x [M, k]."""
    limit = block_rows_limit()
    return (limit is None or x.shape[0] <= limit) and x.dtype == torch.float32 and x.device.type == "cpu"


def block_linear(x: torch.Tensor, w: PanelWeight, lib: ctypes.CDLL | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, k] float32 (CPU) @ W^T -> [M, n] float32, into `out` when given (contiguous). `lib`: the
    kernel library to run (default the native one; tests pass the scalar reference)."""
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.float32:
        raise ValueError(f"block_linear: x must be float32 [M, {k}], got {x.dtype} {list(x.shape)}")
    lib = lib or library()
    if lib is None:
        raise RuntimeError("block_linear: the block kernel could not be built (see the log)")
    x = x.contiguous()
    y = torch.empty((x.shape[0], n), dtype=torch.float32) if out is None else out
    if y.shape != (x.shape[0], n) or y.dtype != torch.float32 or not y.is_contiguous():
        raise ValueError(f"block_linear: out must be a contiguous float32 [{x.shape[0]}, {n}] tensor")
    rc = lib.block_gemm(ctypes.byref(w.struct), x.data_ptr(), x.shape[0], k, n, y.data_ptr(), ffi.kernel_threads())
    if rc != 0:
        raise RuntimeError(f"block_gemm failed for a [{n}, {k}] weight (k must be a multiple of {BLOCK})")
    return y
