"""float32 GEMMs on weights kept in GGUF's 32-weight blocks (Q4_0, Q4_1, Q8_0), for CPU decoding.

A decode step multiplies a handful of activation rows by every weight matrix, so its speed is the
speed of streaming the weights. A Q4_1 matrix dequantized to float32 is 4 bytes a weight; kept in
its blocks it is 0.56. `runtime/csrc/block_gemm.c` widens the blocks in registers and does all math in
float32 on exactly the weights the gguf package dequantizes to (each block summed as
d * sum(q x) + m * sum(x), a rearranged sum), so results match a dense float32 GEMM to float32
rounding. SmolLM2-135M, all matrices, 2 threads: batch 1 6.7 ms vs 27 ms for oneDNN on the dense
weights, batch 4 12.8 vs 28 ms; from about 8 rows the dense GEMM wins (it becomes compute-bound), so
`use_blocks` routes only up to BLOCK_MAX_ROWS rows here.

The C file is built on first use (`cpu_kernels`); `library()` returns None if that fails, and the
model then runs dense GEMMs only.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np
import torch

from radixgen.runtime import cpu_kernels

BLOCK = 32  # weights per block
BLOCK_MAX_ROWS = 4  # activation rows up to which the block kernel beats the dense GEMM
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


def concat_rows(parts: list[BlockWeight]) -> BlockWeight | None:
    """Stack weights along rows (fused q/k/v or gate/up); None if their formats differ."""
    if len({(p.bits, p.shape[1]) for p in parts}) != 1:
        return None
    cat = lambda ts: None if ts[0] is None else torch.cat(ts)
    return BlockWeight(parts[0].bits, cat([p.qs for p in parts]), cat([p.scale for p in parts]),
                       cat([p.minv for p in parts]))


_ARGS = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
         ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, or None if no compiler can build it (see `cpu_kernels.load`)."""
    return cpu_kernels.load("block_gemm", {"block_gemm": (ctypes.c_int, _ARGS)})


def use_blocks(x: torch.Tensor) -> bool:
    """Whether `block_linear` is the faster choice for activations x [M, k]."""
    return x.shape[0] <= BLOCK_MAX_ROWS and x.dtype == torch.float32 and x.device.type == "cpu"


def block_linear(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
    """x [M, k] float32 (CPU) @ W^T -> [M, n] float32. Needs `library()`."""
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.float32:
        raise ValueError(f"block_linear: x must be float32 [M, {k}], got {x.dtype} {list(x.shape)}")
    lib = library()
    if lib is None:
        raise RuntimeError("block_linear: the block kernel could not be built (see the log)")
    x = x.contiguous()
    y = torch.empty((x.shape[0], n), dtype=torch.float32)
    minv = w.minv.data_ptr() if w.minv is not None else None
    rc = lib.block_gemm(w.bits, x.data_ptr(), x.shape[0], k, w.qs.data_ptr(), w.scale.data_ptr(), minv, n,
                        y.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"block_gemm failed for a [{n}, {k}] weight (k must be a multiple of {BLOCK})")
    return y
