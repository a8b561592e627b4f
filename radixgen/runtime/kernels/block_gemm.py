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
as float32 FMAs; any number on AMX, whose int8 tiles compute the same integer sums from 16 rows on).
Each output sums its products in one order whatever the row count, so within that range a request's
logits do not depend on its batch-mates (on AMX the fp16 formats in three limbs run on bfloat16 tiles
instead: float32's rounding, not the same bits). Rows that accept less precision (long prompt chunks,
`wide_matmul_dtype` int16 / int8) may take two limbs or one (`limbs`).

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

import torch

from radixgen.runtime.kernels import ffi
from radixgen.runtime.threads import on_short_lived_thread, serial_torch_on_this_thread

logger = logging.getLogger(__name__)

BLOCK = 32  # weights per block
BLOCK_MAX_ROWS = 20  # rows up to which the block kernel's vector paths beat the dense GEMM on every CPU measured
PANEL = 16  # output rows per panel (csrc/block_gemm.c)
LIMBS = 3  # int8 limbs per activation that give float32's precision (csrc/block_gemm.c)
# rg_block_weight's flags (csrc/block_format.h)
SCALES_F32, UNSIGNED8, HALF_BLOCKS, SUPER_BLOCKS, MIN_OFFSET = 1, 2, 4, 8, 16


@dataclass
class KFactors:
    """A K-quant's scales as the file holds them: per block (per half block for Q6_K) small integers sc
    (and m), per 8 blocks fp16 factors d (and dmin): scale = d * sc, min = -(dmin * m), or -32 scale
    for Q6_K (no dmin). The kernel reads these instead of float32 scales (the file's bytes)."""

    d: torch.Tensor  # [n, k/256] float32 (fp16 values)
    sc: torch.Tensor  # [n, k/32 * halves] int16 (Q4_K 0..63, Q6_K -128..127)
    dmin: torch.Tensor | None = None  # [n, k/256]
    m: torch.Tensor | None = None  # [n, k/32] 0..63

    def select(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> KFactors:
        """The factors with `fn` applied to each tensor (row selections, concatenations)."""
        return KFactors(*(None if t is None else fn(t) for t in (self.d, self.sc, self.dmin, self.m)))


@dataclass
class BlockWeight:
    """A [n, k] weight in 32-weight blocks, W = scale * q + minv, with a scale and min per block, or per
    half block (16 weights) where `scale` has twice the columns.

    bits 4: qs uint8 [n, k/2], q 0..15 (in each block's 16 bytes, low nibble = weight j, high = j + 16).
    bits 6 (Q6_K): qs uint8 [n, k/32 * 24], per block those 16 bytes of q's low 4 bits, then 8 bytes of
    its high 2 bits (byte 4p + t, bits 2i: weight 4 (p + 2i) + t).
    bits 5 (Q5_0, Q5_1, Q5_K): qs uint8 [n, k/32 * 20], q 0..31: per block those 16 bytes of the low 4
    bits, then 4 bytes of the high bit (byte t, bit g: weight 4g + t).
    bits 8: qs [n, k], int8 (signed q, no min: Q8_0, Q5_0) or uint8 (q 0..63, with a min: the 5-, 3-
    and 2-bit types). scale, minv: float32 [n, k/32 * halves]."""

    bits: int
    qs: torch.Tensor
    scale: torch.Tensor
    minv: torch.Tensor | None
    factors: KFactors | None = None  # Q4_K / Q6_K's own scale bytes (scale and minv follow from them)

    @property
    def shape(self) -> tuple[int, int]:
        n, width = self.qs.shape
        return n, {4: width * 2, 5: width // 20 * BLOCK, 6: width // 24 * BLOCK, 8: width}[self.bits]

    @property
    def halves(self) -> int:
        """Scales per 32-weight block: 1, or 2 (one per 16 weights)."""
        return self.scale.shape[1] * BLOCK // self.shape[1]

    @property
    def layout(self) -> tuple[int, torch.dtype, int, int]:
        """What two weights must share to be stacked into one matrix (and to run in one format)."""
        return self.bits, self.qs.dtype, self.halves, self.shape[1]

    def rows(self, index: torch.Tensor) -> BlockWeight:
        """The weight with its rows reordered/selected by `index` ([n'] int64)."""
        pick = lambda t: None if t is None else t.index_select(0, index).contiguous()
        factors = None if self.factors is None else self.factors.select(pick)
        return BlockWeight(self.bits, pick(self.qs), pick(self.scale), pick(self.minv), factors)

    def q(self) -> torch.Tensor:
        """The integers q as int32 [n, k]."""
        n, k = self.shape
        if self.bits == 8:
            return self.qs.to(torch.int32)
        per_block = self.qs.view(n, k // BLOCK, -1)
        low = torch.cat([per_block[..., :16] & 15, per_block[..., :16] >> 4], dim=-1).to(torch.int32)  # [n, nb, 32]
        if self.bits == 4:
            return low.view(n, k)
        if self.bits == 5:
            hb = per_block[..., 16:].to(torch.int32)  # [n, nb, t]
            high = (hb[..., None, :] >> torch.arange(8, dtype=torch.int32).view(8, 1)) & 1  # [n, nb, g, t]
            return (low | (high.reshape(n, -1, BLOCK) << 4)).view(n, k)
        hi = per_block[..., 16:].view(n, -1, 1, 2, 4).to(torch.int32)  # [n, nb, 1, p, t]
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int32).view(1, 1, 4, 1, 1)
        high = ((hi >> shifts) & 3).reshape(n, -1, BLOCK)  # [n, nb, i, p, t]: weight 8i + 4p + t
        return (low | (high << 4)).view(n, k)

    def dequantize(self) -> torch.Tensor:
        """The float32 [n, k] matrix: scale * q + minv, each a float32 product and sum (as gguf computes)."""
        n, k = self.shape
        span = BLOCK // self.halves
        q = self.q().float().view(n, -1, span)
        w = q * self.scale[..., None]
        if self.minv is not None:
            w = w + self.minv[..., None]
        return w.view(n, k)


@dataclass
class PanelWeight:
    """A BlockWeight repacked for the kernel: rows padded to a multiple of 16 and grouped in panels
    of 16; in each block, 4 consecutive weights of the 16 rows form one 64-byte vector (see
    csrc/block_gemm.c). bits 4: qs uint8 [P, k/32, 4, 16, 4] (GGUF's block bytes: low nibble weight
    4g + t, high nibble 16 + 4g + t); bits 5: those, then [P, k/32, 1, 16, 4] of the high bits (byte t,
    bit g: weight 4g + t); bits 8: qs [P, k/32, 8, 16, 4]; scale, minv [P, k/32, halves, 16]
    in float16 where every value is one exactly (GGUF's own fp16 scales), else float32. K-quants in
    their own bytes (SUPER_BLOCKS): Q4_K scale, minv uint8 sc, m [P, k/32, 16] and `sup` fp16 d, dmin
    [P, k/256, 2, 16]; Q6_K (bits 6) qs [P, k/32, 6, 16, 4] (the 4-bit plane, then the 2-bit one), scale
    int8 [P, k/32, 2, 16], no minv, `sup` fp16 d [P, k/256, 16]. `flags`: csrc/block_format.h's."""

    bits: int
    flags: int
    n: int  # rows of the weight (the padding rows are zeros)
    qs: torch.Tensor
    scale: torch.Tensor
    minv: torch.Tensor | None
    sup: torch.Tensor | None = None  # K-quants' fp16 factors per 8 blocks [P, k/256, 1 or 2, 16]

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.qs.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.scale, self.minv, self.sup) if t is not None)

    @functools.cached_property
    def struct(self) -> ffi.BlockWeightC:
        """The C view (rg_block_weight) of these tensors (built once; they must not be replaced)."""
        ptr = lambda t: None if t is None else t.data_ptr()
        return ffi.BlockWeightC(self.bits, self.flags, self.qs.data_ptr(), self.scale.data_ptr(), ptr(self.minv),
                                ptr(self.sup))


def _half_if_exact(t: torch.Tensor) -> torch.Tensor | None:
    """float32 -> float16 when every value survives exactly (GGUF's fp16 scales, Q4_0's -8 d), else None."""
    h = t.to(torch.float16)
    return h if torch.equal(h.float(), t) else None


def pack_panels(w: BlockWeight) -> PanelWeight:
    """`w` in the kernel's panel layout (a copy; `w` is unchanged): a K-quant's own scale bytes where it
    has them (Q4_K, Q6_K), else its scales in fp16 where exact, else float32."""
    n, k = w.shape
    nb, pad, halves = k // BLOCK, -n % PANEL, w.halves
    panels = (n + pad) // PANEL
    signed = w.qs.dtype == torch.int8
    if (signed and w.minv is not None) or (w.bits == 8 and not signed and w.minv is None):
        raise ValueError("block weight: signed 8-bit q take no min, unsigned ones need one")
    if halves == 2 and (w.bits in (4, 5) or signed):
        raise ValueError("block weight: scales per half block are read for unsigned 8-bit q and Q6_K's only")
    if w.bits == 8 and not signed and int(w.qs.max()) > 63:
        raise ValueError("block weight: unsigned 8-bit q must be at most 63 (AVX2's pair sums)")

    def panel_major(t: torch.Tensor | None, groups: int, width: int) -> torch.Tensor | None:
        """[n, nb * groups * width] -> [P, nb, groups, 16, width] (nb: the tensor's own block count), in one
        copy (the padding rows of the last panel zero)."""
        if t is None:
            return None
        blocks = t.shape[1] // (groups * width)
        src = t.reshape(n, blocks, groups, width)
        out = t.new_empty(panels, blocks, groups, PANEL, width)
        whole = n // PANEL
        out[:whole].copy_(src[: whole * PANEL].view(whole, PANEL, blocks, groups, width).permute(0, 2, 3, 1, 4))
        if pad:
            out[whole].zero_()
            out[whole, :, :, : n - whole * PANEL].copy_(src[whole * PANEL :].permute(1, 2, 0, 3))
        return out

    per_block = lambda t, per: None if t is None else panel_major(t, per, 1)[..., 0].contiguous()  # [P, b, per, 16]
    f = w.factors
    if f is not None and w.bits == 4 and f.dmin is not None:  # Q4_K: its bytes, 6-bit sc and m widened to one
        sup = per_block(torch.stack([f.d, f.dmin], dim=2).reshape(n, -1).half(), 2)
        return PanelWeight(4, SUPER_BLOCKS, n, panel_major(w.qs, 4, 4), per_block(f.sc.to(torch.uint8), 1)[:, :, 0],
                           per_block(f.m.to(torch.uint8), 1)[:, :, 0].contiguous(), sup)
    if w.bits == 6:  # Q6_K: a 4-bit and a 2-bit plane
        if f is None or f.dmin is not None or halves != 2:
            raise ValueError("block weight: 6-bit q are Q6_K's, with its factors")
        planes = w.qs.view(n, nb, 24)
        low, high = planes[..., :16].reshape(n, -1), planes[..., 16:].reshape(n, -1)
        qs = torch.cat([panel_major(low, 4, 4), panel_major(high, 2, 4)], dim=2)
        return PanelWeight(6, SUPER_BLOCKS | HALF_BLOCKS, n, qs.contiguous(), per_block(f.sc.to(torch.int8), 2),
                           None, per_block(f.d.half(), 1)[:, :, 0].contiguous())
    if w.bits == 5:  # a 4-bit and a 1-bit plane
        planes = w.qs.view(n, nb, 20)
        low, high = planes[..., :16].reshape(n, -1), planes[..., 16:].reshape(n, -1)
        qs = torch.cat([panel_major(low, 4, 4), panel_major(high, 1, 4)], dim=2).contiguous()
    else:
        qs = panel_major(w.qs, 4 if w.bits == 4 else 8, 4)  # 64-byte vectors per block
    scale, minv = w.scale, w.minv
    flags = 0 if signed or w.bits in (4, 5) else UNSIGNED8 | SCALES_F32
    if halves == 2:
        flags |= HALF_BLOCKS
    if not flags & SCALES_F32:
        half_scale = _half_if_exact(scale)
        half_min = None if minv is None else _half_if_exact(minv)
        if half_scale is not None and (minv is None or half_min is not None):
            scale, minv = half_scale, half_min
            if minv is not None and torch.equal(minv.float(), scale.float() * -(1 << (w.bits - 1))):
                flags |= MIN_OFFSET  # Q4_0, Q5_0: d (q - 8), d (q - 16), the kernel's offset formats
        elif signed:
            raise ValueError("block weight: signed 8-bit q need float16 scales")
        else:
            flags |= SCALES_F32
    return PanelWeight(w.bits, flags, n, qs, per_block(scale, halves), per_block(minv, halves))


# weights `pack_panels_by_rows` reads and packs at a time: a chunk's buffers stay above glibc's largest
# mmap threshold (32 MiB), so each goes back to the OS when freed instead of staying in the heap
PACK_CHUNK_WEIGHTS = 48 << 20


def pack_panels_by_rows(n: int, k: int, read: Callable[[slice], BlockWeight | None],
                        chunk_weights: int = PACK_CHUNK_WEIGHTS) -> PanelWeight | None:
    """`pack_panels` of an [n, k] weight read `chunk_weights` weights' rows at a time (`read(rows)`:
    those rows as a BlockWeight; None: the weight is not in blocks, and neither is the result), packed into
    tensors allocated once, so that loading holds the packed weight and one chunk, not also the whole
    BlockWeight and the file's bytes (Gemma 3's 262k-row table: 0.18 GB each). The same tensors as
    `pack_panels` of the whole weight; where the chunks' formats differ (float32-derived scales that fit
    fp16 in one chunk only) the whole weight is read and packed at once."""
    chunk = max(PANEL, chunk_weights // k // PANEL * PANEL)  # whole panels: each chunk's follow the last
    first = read(slice(0, min(chunk, n)))
    if first is None:
        return None
    first = pack_panels(first)
    if n <= chunk:
        return first

    def tensors(p: PanelWeight) -> list[torch.Tensor | None]:
        return [p.qs, p.scale, p.minv, p.sup]

    def layout(p: PanelWeight) -> tuple:
        """What a chunk must share with the first to be copied into the same tensors."""
        return p.bits, p.flags, [None if t is None else (t.dtype, t.shape[1:]) for t in tensors(p)]

    def grown(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        out = t.new_empty((-(-n // PANEL), *t.shape[1:]))
        out[: t.shape[0]].copy_(t)
        return out

    whole = PanelWeight(first.bits, first.flags, n, *(grown(t) for t in tensors(first)))
    for start in range(chunk, n, chunk):
        part = pack_panels(read(slice(start, min(start + chunk, n))))
        if layout(part) != layout(first):
            return pack_panels(read(slice(None)))
        p0 = start // PANEL
        for dst, src in zip(tensors(whole), tensors(part), strict=True):
            if dst is not None:
                dst[p0 : p0 + src.shape[0]].copy_(src)
    return whole


def signed8(w: BlockWeight) -> BlockWeight | None:
    """`w` as signed 8-bit q with no min (Q8_0's format), value for value: a signed one itself, a 5-bit one
    whose min is -16 scale (Q5_0: d (q - 16)) as q - 16; None for others."""
    if w.bits == 8 and w.qs.dtype == torch.int8:
        return w
    if w.bits != 5 or w.halves != 1 or not torch.equal(w.minv, -16.0 * w.scale):
        return None
    return BlockWeight(8, (w.q() - 16).to(torch.int8), w.scale, None)


def widened(w: BlockWeight) -> BlockWeight | None:
    """`w` as unsigned 8-bit q with a scale and min per half block, the format every other unsigned one
    fits in, value for value (None for signed 8-bit q, which do not fit)."""
    if w.bits == 8 and w.qs.dtype == torch.int8:
        return None
    q = w.q().to(torch.uint8)
    if w.halves == 2:
        return BlockWeight(8, q, w.scale, w.minv)
    return BlockWeight(8, q, w.scale.repeat_interleave(2, dim=1), w.minv.repeat_interleave(2, dim=1))


def concat_rows(parts: list[BlockWeight]) -> BlockWeight | None:
    """Stack weights along rows (fused q/k/v or gate/up), in the widest format among them when they
    differ (Q4_K_M's Q4_K q/k beside a Q6_K v; signed 8-bit where one is: Gemma's Q5_0 q/k beside a Q8_0
    v); None where no format holds them all."""
    if len({p.layout for p in parts}) != 1 or len({p.minv is None for p in parts}) != 1:
        signed = [signed8(p) for p in parts]
        wide = signed if all(s is not None for s in signed) else [widened(p) for p in parts]
        if any(w is None for w in wide) or len({w.shape[1] for w in wide}) != 1:
            return None
        parts = wide
    cat = lambda ts: None if ts[0] is None else torch.cat(ts)
    factors = None
    if all(p.factors is not None for p in parts) and len({p.factors.dmin is None for p in parts}) == 1:
        fs = [p.factors for p in parts]
        factors = KFactors(*(cat([getattr(f, a) for f in fs]) for a in ("d", "sc", "dmin", "m")))
    return BlockWeight(parts[0].bits, cat([p.qs for p in parts]), cat([p.scale for p in parts]),
                       cat([p.minv for p in parts]), factors)


def block_dequant_rows(w: PanelWeight, rows: torch.Tensor, dtype: torch.dtype = torch.float32,
                       out: torch.Tensor | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """Rows `rows` (int64 [R]) of `w` as a [R, k] float32 or bfloat16 matrix (the values `dequantize`
    gives), into `out` when given. `lib`: the kernel library to run (default the native one)."""
    n, k = w.shape
    codes = {torch.float32: 0, torch.bfloat16: 1}
    if dtype not in codes:
        raise ValueError(f"block_dequant_rows: dtype must be float32 or bfloat16, got {dtype}")
    rows = rows.to(torch.int64).contiguous()
    y = torch.empty((rows.shape[0], k), dtype=dtype) if out is None else out
    lib = lib or library()
    if lib is None:
        raise RuntimeError("block_dequant_rows: the kernels could not be built (see the log)")
    rc = lib.block_dequant_rows(ctypes.byref(w.struct), n, k, rows.data_ptr(), rows.shape[0], y.data_ptr(),
                                codes[dtype], ffi.kernel_threads())
    if rc == -2:  # (checked in C: a bounds check in torch cost two reductions a decode step)
        raise IndexError(f"block_dequant_rows: rows must be in [0, {n})")
    if rc != 0:
        raise RuntimeError(f"block_dequant_rows failed for a [{n}, {k}] weight")
    return y


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
                 out: torch.Tensor | None = None, limbs: int = LIMBS) -> torch.Tensor:
    """x [M, k] float32 (CPU) @ W^T -> [M, n] float32, into `out` when given (contiguous). `lib`: the
    kernel library to run (default the native one; tests pass the scalar reference). `limbs`: int8
    limbs per activation (3: float32's precision; 2: 2^-16 of each 32-value block's largest; 1: 2^-8)."""
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.float32:
        raise ValueError(f"block_linear: x must be float32 [M, {k}], got {x.dtype} {list(x.shape)}")
    if limbs not in (1, 2, LIMBS):
        raise ValueError(f"block_linear: limbs must be 1, 2 or {LIMBS}, got {limbs}")
    lib = lib or library()
    if lib is None:
        raise RuntimeError("block_linear: the block kernel could not be built (see the log)")
    x = x.contiguous()
    y = torch.empty((x.shape[0], n), dtype=torch.float32) if out is None else out
    if y.shape != (x.shape[0], n) or y.dtype != torch.float32 or not y.is_contiguous():
        raise ValueError(f"block_linear: out must be a contiguous float32 [{x.shape[0]}, {n}] tensor")
    rc = lib.block_gemm_limbs(ctypes.byref(w.struct), x.data_ptr(), x.shape[0], k, n, y.data_ptr(), limbs,
                              ffi.kernel_threads())
    if rc != 0:
        raise RuntimeError(f"block_gemm failed for a [{n}, {k}] weight (k must be a multiple of {BLOCK})")
    return y


@functools.cache
def bf16_tiles_available() -> bool:
    """Whether `block_linear_bf16` runs here (AMX bfloat16 tiles that the OS lends this process)."""
    lib = library()
    return lib is not None and lib.block_gemm_bf16_available() == 1


def block_linear_bf16(x: torch.Tensor, w: PanelWeight) -> torch.Tensor:
    """x [M, k] float32 (CPU) @ W^T -> [M, n] float32 with x and W each rounded to bfloat16 (W's values as
    `block_dequant_rows` rounds them) and float32 sums, on AMX tiles that dequantize W a panel at a time:
    the wide steps' bfloat16 GEMM where `bf16_tiles_available()`."""
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.float32:
        raise ValueError(f"block_linear_bf16: x must be float32 [M, {k}], got {x.dtype} {list(x.shape)}")
    if not bf16_tiles_available():
        raise RuntimeError("block_linear_bf16: this CPU has no AMX bfloat16 tiles (see bf16_tiles_available)")
    x = x.contiguous()
    y = torch.empty((x.shape[0], n), dtype=torch.float32)
    if x.shape[0] == 0:
        return y
    rc = library().block_gemm_bf16(ctypes.byref(w.struct), x.data_ptr(), x.shape[0], k, n, y.data_ptr(),
                                   ffi.kernel_threads())
    if rc != 0:
        raise RuntimeError(f"block_gemm_bf16 failed for a [{n}, {k}] weight (k must be a multiple of {BLOCK})")
    return y
