"""GEMMs on weights kept in GGUF's 32-weight blocks (Q4_0, Q4_1, Q8_0), for CPU decoding.

A decode step multiplies a handful of activation rows by every weight matrix. A Q4_1 matrix
dequantized to float32 is 4 bytes a weight; kept in its blocks (fp16 scales) it is 0.625.
`csrc/block_gemm.c` reads the blocks repacked into panels of 16 output rows (`pack_panels`) and
multiplies them by integer dot products with the activations split into three int8 limbs (24
bits: float32's precision; the results match a float32 GEMM on the gguf-dequantized weights to
~1e-7 relative). Widening each weight to float32 instead, as this kernel did before, cost ~5x the
vector instructions: on SmolLM2-135M (one thread, CPU time, Xeon with AVX512-VNNI) one decode row
through the 210 layer matrices took 15.5 ms that way and takes 9.3 ms now, the Q8_0 head 5.3 -> 3.1
ms, where the weights' streaming from memory is the bound. `use_blocks` routes up to BLOCK_MAX_ROWS
rows here. Each output sums its products in one order whatever the row count, so within that range
a request's logits do not depend on its batch-mates.

The C file is built on first use (`ffi.library()` is None if that fails, and the model then runs
dense GEMMs only).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np
import torch

from radixgen.runtime.kernels import ffi

BLOCK = 32  # weights per block
BLOCK_MAX_ROWS = 20  # activation rows up to which the block kernel's vector paths beat the dense GEMM
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


@functools.cache
def block_rows_limit() -> int | None:
    """Most activation rows for which the block kernel beats a dense float32 GEMM: None (any number)
    where it runs on AMX tiles from `block_gemm_amx_rows()` rows on, else BLOCK_MAX_ROWS (its vector
    paths; above that oneDNN's float32 GEMM is faster)."""
    lib = library()
    return None if lib is not None and lib.block_gemm_amx_rows() > 0 else BLOCK_MAX_ROWS


def use_blocks(x: torch.Tensor) -> bool:
    """Whether `block_linear` is the faster choice for activations x [M, k]."""
    limit = block_rows_limit()
    return (limit is None or x.shape[0] <= limit) and x.dtype == torch.float32 and x.device.type == "cpu"


def block_linear(x: torch.Tensor, w: PanelWeight, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [M, k] float32 (CPU) @ W^T -> [M, n] float32. `lib`: the kernel library to run (default
    the native one; tests pass the scalar reference)."""
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.float32:
        raise ValueError(f"block_linear: x must be float32 [M, {k}], got {x.dtype} {list(x.shape)}")
    lib = lib or library()
    if lib is None:
        raise RuntimeError("block_linear: the block kernel could not be built (see the log)")
    x = x.contiguous()
    y = torch.empty((x.shape[0], n), dtype=torch.float32)
    rc = lib.block_gemm(ctypes.byref(w.struct), x.data_ptr(), x.shape[0], k, n, y.data_ptr(), ffi.kernel_threads())
    if rc != 0:
        raise RuntimeError(f"block_gemm failed for a [{n}, {k}] weight (k must be a multiple of {BLOCK})")
    return y
