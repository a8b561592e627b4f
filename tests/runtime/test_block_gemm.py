"""The GGUF block kernel, every quant type, against the gguf package's own dequantization (float64
reference GEMM)."""

from __future__ import annotations

import ctypes
import threading

import gguf
import numpy as np
import pytest
import torch

from radixgen.runtime.kernels import build, ffi
from radixgen.runtime.kernels.block_gemm import (
    BLOCK_MAX_ROWS,
    SCALES_F32,
    SUPER_BLOCKS,
    WIDE_ROWS,
    BlockWeight,
    bf16_tiles_available,
    block_dequant_rows,
    block_linear,
    block_linear_bf16,
    block_over_dense_time,
    block_rows_limit,
    concat_rows,
    library,
    pack_panels,
    pack_panels_by_rows,
    use_blocks,
)
from radixgen.runtime.kernels.gguf_blocks import BLOCK_BYTES, BLOCK_WEIGHTS, from_gguf

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler to build the block kernel")


# Where each GGUF type keeps its fp16 fields (byte offsets in a block): random bytes there could be
# inf or nan; every other byte of every type is any value.
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
ALL_TYPES = list(F16_FIELDS)


def random_gguf(qtype: str, n: int, k: int, seed: int) -> np.ndarray:
    """Raw GGUF bytes [n, bytes per row] of random blocks with finite, varied fp16 scales."""
    rng = np.random.default_rng(seed)
    nb = k // BLOCK_WEIGHTS[qtype]
    raw = rng.integers(0, 256, (n, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        raw[..., at : at + 2] = rng.uniform(-0.05, 0.05, (n, nb, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(n, -1)


def width(qtype: str, blocks: int = 3) -> int:
    """A row length of `blocks` of the type's blocks (32 weights, or 256 for K-quants)."""
    return blocks * BLOCK_WEIGHTS[qtype]


def gguf_dense(raw: np.ndarray, qtype: str, n: int, k: int) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(n, k).copy())


SIMD_BUILDS = ["native", *build.PATH_VARIANTS]  # the native build, then the narrower SIMD paths' builds


def simd_build_or_skip(variant: str) -> ctypes.CDLL:
    """The kernel library in `variant` (one of SIMD_BUILDS); skips where this CPU cannot run it, fails where
    it does not build (a None would let the callers fall back to the native library)."""
    if variant != "native" and not build.PATH_VARIANTS[variant][0] <= build.cpu_flags():
        pytest.skip(f"this CPU cannot run the {variant} build")
    lib = ffi.load(variant)
    assert lib is not None, f"the {variant} build failed"
    return lib


@pytest.fixture(scope="module", params=SIMD_BUILDS)
def simd_build(request) -> ctypes.CDLL:
    """The native kernel build, then each narrower SIMD build this CPU can run (AVX2, AVX-VNNI, AVX-512 VNNI)."""
    return simd_build_or_skip(request.param)


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_blocks_are_ggufs_values(simd_build, qtype):
    """Our reading of every type's bytes is gguf's dequantization, bit for bit, in Python and in C (the
    embedding lookup and the wide steps' slices) in every SIMD build, in float32 and rounded to bfloat16."""
    n, k = 37, width(qtype, 2)
    raw = random_gguf(qtype, n, k, seed=5)
    dense = gguf_dense(raw, qtype, n, k)
    w = from_gguf(raw, qtype)
    assert torch.equal(w.dequantize(), dense)
    panels = pack_panels(w)
    # scattered rows (row by row), whole panels from a panel's first row (vectorized), partial last ones
    # (5 rows: a half panel's odd row count; 11: the second half's)
    for rows in (torch.tensor([36, 0, 17, 17, 5]), torch.arange(n), torch.arange(16, n), torch.arange(16, 21),
                 torch.arange(16, 27)):
        assert torch.equal(block_dequant_rows(panels, rows, lib=simd_build), dense[rows])
        assert torch.equal(block_dequant_rows(panels, rows, torch.bfloat16, lib=simd_build), dense[rows].bfloat16())


@pytest.mark.parametrize("qtype", ALL_TYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 9, 16, 17, 40])
def test_block_linear_matches_gguf_dequantized(qtype, m):
    n, k = 37, width(qtype)  # three panels, the last one partial; three blocks per row
    raw = random_gguf(qtype, n, k, seed=m)
    dense = gguf_dense(raw, qtype, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    ref = x.double() @ dense.double().t()
    y = block_linear(x, pack_panels(from_gguf(raw, qtype)))
    assert y.shape == (m, n)
    assert (y.double() - ref).abs().max().item() <= 1e-5 * (1 + ref.abs().max().item())


@pytest.mark.parametrize("qtype", ALL_TYPES)
@pytest.mark.parametrize("limbs", [1, 2, 3])
def test_block_linear_rows_do_not_depend_on_batch_mates(simd_build, qtype, limbs):
    """Each output sums the same integer products and combines them in the same float operations on every
    path of a build (the vector path, its rows taken one, two, four or eight at a time, and AMX int8 tiles
    from `block_gemm_amx_rows()` rows where the CPU has them), so a row's result is bit-identical alone or
    among any others (the 8-row groups, 16-row tiles and their remainders). One exception: on AMX the fp16
    formats (Q4_0, Q4_1, Q8_0) in three limbs run on bfloat16 tiles instead, float32 sums in another order:
    the same bits among those rows, and within 2 k 2^-24 times the sum of the products' magnitudes of the
    vector path's."""
    n, k = 50, width(qtype)
    raw = random_gguf(qtype, n, k, 7)
    w = pack_panels(from_gguf(raw, qtype))
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(3))
    alone = torch.cat([block_linear(x[i : i + 1], w, simd_build, limbs=limbs) for i in range(len(x))])
    wide = block_linear(x, w, simd_build, limbs=limbs)
    amx_rows = simd_build.block_gemm_amx_rows()
    bf16_tiles = amx_rows > 0 and limbs == 3 and qtype in ("Q4_0", "Q4_1", "Q8_0")
    reorder_bound = 2 * k * 2.0**-24 * (x.double().abs() @ gguf_dense(raw, qtype, n, k).double().abs().t())
    for m in (2, 5, 9, 16, 17, 20, 40, 70):
        y = block_linear(x[:m], w, simd_build, limbs=limbs)
        assert torch.equal(y, wide[:m] if bf16_tiles and m >= amx_rows else alone[:m])
        assert ((y - alone[:m]).double().abs() <= reorder_bound[:m]).all()


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_bf16_tiles_sum_bfloat16_factors_in_float32(qtype):
    """The wide steps' bfloat16 GEMM on AMX tiles: x and the weights (gguf's values) each rounded to bfloat16,
    their products summed in float32, so within 2 k 2^-24 times the sum of the products' magnitudes of the
    float64 GEMM of those factors; row counts around the 16-row tiles and the 256-row chunks, panels (16
    weight rows, in pairs) with a partial last one and an odd count, and a K that 256 rows take in two
    passes (1,024 + 256). Without the tiles: a clear error."""
    for n, k in ((37, width(qtype)), (50, width(qtype)), (37, 1280)):  # 3 panels (the third partial), 4 panels
        raw = random_gguf(qtype, n, k, seed=n + k)
        w = pack_panels(from_gguf(raw, qtype))
        factors = gguf_dense(raw, qtype, n, k).bfloat16().double()
        for m in (1, 17, 40, 300):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            if not bf16_tiles_available():
                with pytest.raises(RuntimeError, match="no AMX"):
                    block_linear_bf16(x, w)
                return
            xb = x.bfloat16().double()
            ref, bound = xb @ factors.t(), 2 * k * 2.0**-24 * (xb.abs() @ factors.abs().t())
            y = block_linear_bf16(x, w)
            assert y.shape == (m, n) and ((y.double() - ref).abs() <= bound).all()


def limb_error_bound(x: torch.Tensor, dense: torch.Tensor, limbs: int) -> torch.Tensor:
    """[m, n]: the most that x's rounding to `limbs` int8 limbs per 32-value block can move x @ dense^T:
    each value is off by at most half its block's last limb step, amax / 127 / 254^(limbs - 1) / 2."""
    m, k = x.shape
    step = x.double().view(m, k // 32, 32).abs().amax(-1) / 127 / 254 ** (limbs - 1)  # [m, k/32]
    w_abs = dense.double().abs().view(dense.shape[0], k // 32, 32).sum(-1)  # [n, k/32]
    return 0.5 * step @ w_abs.t()


@pytest.mark.parametrize("qtype", ALL_TYPES)
@pytest.mark.parametrize("limbs", [1, 2])
def test_fewer_limbs_stay_within_their_rounding(qtype, limbs):
    """Long prompt chunks' rows (`wide_matmul_dtype` int16 / int8) in two limbs or one: each output is
    within what rounding the activations to that many limbs can move it (float64 GEMM on gguf's
    dequantization, plus float32 sums), and each row is the same alone as among others (the padding
    rows of a last partial tile change nothing)."""
    n, k = 37, width(qtype)
    raw = random_gguf(qtype, n, k, seed=11)
    dense = gguf_dense(raw, qtype, n, k)
    x = torch.randn(21, k, generator=torch.Generator().manual_seed(limbs)) * torch.logspace(-2, 1, k)  # uneven blocks
    w = pack_panels(from_gguf(raw, qtype))
    ref = x.double() @ dense.double().t()
    y = block_linear(x, w, limbs=limbs).double()
    bound = limb_error_bound(x, dense, limbs) + 1e-5 * (1 + ref.abs().max().item())
    assert ((y - ref).abs() <= bound).all()
    assert (y - ref).abs().max() > 1e-5 * ref.abs().max()  # fewer limbs than float32's: not the exact sums
    for m in (1, 5, 8, 13):
        assert torch.equal(block_linear(x[:m], w, limbs=limbs), y[:m].float())
    with pytest.raises(ValueError, match="limbs"):
        block_linear(x, w, limbs=4)


def test_mixed_formats_stack_in_the_widest():
    """Q4_K_M's fused q/k/v: Q4_K q and k beside a Q6_K v stack as one matrix of 8-bit q with a scale
    per half block, value for value; signed Q8_0 beside an unsigned type has no common format."""
    k = width("Q4_K", 2)
    raws = {t: random_gguf(t, 16, k, seed=i) for i, t in enumerate(["Q4_K", "Q6_K", "Q8_0", "Q5_K"])}
    ws = {t: from_gguf(r, t) for t, r in raws.items()}
    both = concat_rows([ws["Q4_K"], ws["Q5_K"], ws["Q6_K"]])
    expect = torch.cat([gguf_dense(raws[t], t, 16, k) for t in ("Q4_K", "Q5_K", "Q6_K")])
    assert both is not None and both.halves == 2 and torch.equal(both.dequantize(), expect)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(0))
    ref = x.double() @ expect.double().t()
    assert (block_linear(x, pack_panels(both)).double() - ref).abs().max().item() <= 1e-5 * (1 + ref.abs().max().item())
    assert concat_rows([ws["Q8_0"], ws["Q6_K"]]) is None


def test_q5_0_beside_q8_0_stacks_as_signed_bytes():
    """Gemma 3 270M's fused q/k/v: Q5_0 q and k beside a Q8_0 v stack as one signed 8-bit matrix (Q5_0's
    d (q - 16) as q - 16), value for value; Q5_0 alone keeps its 5-bit planes."""
    k = width("Q5_0", 2)
    raws = {t: random_gguf(t, 16 * (i + 1), k, seed=i) for i, t in enumerate(["Q5_0", "Q8_0"])}
    fused = concat_rows([from_gguf(raws["Q5_0"], "Q5_0"), from_gguf(raws["Q8_0"], "Q8_0")])
    expect = torch.cat([gguf_dense(raws["Q5_0"], "Q5_0", 16, k), gguf_dense(raws["Q8_0"], "Q8_0", 32, k)])
    assert fused is not None and fused.bits == 8 and fused.minv is None and torch.equal(fused.dequantize(), expect)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(1))
    ref = x.double() @ expect.double().t()
    err = (block_linear(x, pack_panels(fused)).double() - ref).abs().max().item()
    assert err <= 1e-5 * (1 + ref.abs().max().item())
    assert concat_rows([from_gguf(raws["Q5_0"], "Q5_0")] * 2).bits == 5


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K", "Q3_K"])
def test_packing_by_rows_gives_the_whole_weights_panels(qtype):
    """A weight read and packed a few panels at a time (loading a 262k-row table without holding it
    three times over) gives the tensors packing it whole does, the last panel's padding included."""
    n, k = 16 * 7 + 5, width(qtype)
    raw = random_gguf(qtype, n, k, 3)
    whole = pack_panels(from_gguf(raw, qtype))
    reads: list[slice] = []

    def read(rows: slice):
        reads.append(rows)
        return from_gguf(raw[rows], qtype)

    by_rows = pack_panels_by_rows(n, k, read, chunk_weights=3 * 16 * k)
    assert [(r.start, r.stop) for r in reads] == [(0, 48), (48, 96), (96, n)]
    assert (by_rows.bits, by_rows.flags, by_rows.n) == (whole.bits, whole.flags, whole.n)
    for got, want in zip((by_rows.qs, by_rows.scale, by_rows.minv, by_rows.sup),
                         (whole.qs, whole.scale, whole.minv, whole.sup), strict=True):
        assert (got is None and want is None) or torch.equal(got, want)
    assert pack_panels_by_rows(n, k, lambda rows: None) is None


def test_packing_by_rows_falls_back_to_whole_where_chunks_differ():
    """Scales that fp16 holds exactly in the first rows only (float32 in the rest): the chunks' formats
    differ, so the weight is packed whole, with float32 scales throughout, as `pack_panels` does."""
    n, k = 64, 64
    g = torch.Generator().manual_seed(0)
    scale = (torch.rand(n, k // 32, generator=g) / 64).half().float()
    scale[32:] += 1e-6  # not fp16 values
    w = BlockWeight(4, torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g), scale, -8 * scale)
    reads: list[slice] = []
    by_rows = pack_panels_by_rows(n, k, lambda rows: reads.append(rows) or w.rows(torch.arange(n)[rows]),
                                  chunk_weights=32 * k)
    whole = pack_panels(w)
    assert whole.flags & SCALES_F32 and by_rows.flags == whole.flags and reads[-1] == slice(None)
    assert all(torch.equal(a, b) for a, b in zip((by_rows.qs, by_rows.scale, by_rows.minv),
                                                  (whole.qs, whole.scale, whole.minv), strict=True))


def test_panels_hold_the_files_scales_where_they_can():
    """GGUF's own fp16 scales stay fp16 in the panels, Q4_K's and Q6_K's integer scales and fp16 factors
    stay as the file has them (their panels take about the file's bytes); the other K-quants' products
    d * sc take float32. 5-bit q take 5 bits (a 4-bit and a 1-bit plane)."""
    raws = {t: random_gguf(t, 32, width(t, 2), 0) for t in ALL_TYPES}
    panels = {t: pack_panels(from_gguf(r, t)) for t, r in raws.items()}
    fp16_or_own = {t for t, p in panels.items() if p.flags & SCALES_F32 == 0}
    assert fp16_or_own == {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K"}
    assert {t for t, p in panels.items() if p.flags & SUPER_BLOCKS} == {"Q4_K", "Q6_K"}
    assert panels["Q6_K"].nbytes == raws["Q6_K"].nbytes  # 6-bit q, int8 scales, fp16 d: the file's bytes
    assert panels["Q4_K"].nbytes / raws["Q4_K"].nbytes == 18.5 / 18  # 6-bit scales and mins widened to a byte
    assert panels["Q5_1"].nbytes == raws["Q5_1"].nbytes  # 5-bit q, fp16 d and m
    assert panels["Q5_0"].nbytes / raws["Q5_0"].nbytes == 24 / 22  # its -16 d stored as an fp16 min
    assert panels["Q5_K"].nbytes / raws["Q5_K"].nbytes == 28 / 22  # float32 d * sc and -dmin * m a block


def test_rows_and_concat_keep_gguf_values():
    a_raw, b_raw = random_gguf("Q4_1", 8, 64, 1), random_gguf("Q4_0", 5, 64, 2)
    a, b = from_gguf(a_raw, "Q4_1"), from_gguf(b_raw, "Q4_0")
    both = concat_rows([a, b])
    expect = torch.cat([gguf_dense(a_raw, "Q4_1", 8, 64), gguf_dense(b_raw, "Q4_0", 5, 64)])
    assert torch.equal(both.dequantize(), expect)
    perm = torch.randperm(13)
    assert torch.equal(both.rows(perm).dequantize(), expect[perm])
    assert concat_rows([a, from_gguf(random_gguf("Q8_0", 4, 64, 3), "Q8_0")]) is None  # signed beside unsigned


def test_bad_input_is_rejected():
    w = pack_panels(from_gguf(random_gguf("Q8_0", 4, 64, 0), "Q8_0"))
    with pytest.raises(ValueError, match="float32"):
        block_linear(torch.randn(2, 32), w)
    with pytest.raises(ValueError, match="float32"):
        block_linear(torch.randn(2, 64, dtype=torch.bfloat16), w)
    for bad in (torch.randn(2, 32), torch.randn(2, 64, dtype=torch.bfloat16), torch.randn(64)):
        with pytest.raises(ValueError, match=r"float32 \[M, 64\]"):
            block_linear_bf16(bad, w)
    with pytest.raises(ValueError, match="IQ2_XXS"):
        from_gguf(np.zeros((1, 66), np.uint8), "IQ2_XXS")
    for bad in ([4], [0, -1]):
        with pytest.raises(IndexError, match="rows"):
            block_dequant_rows(w, torch.tensor(bad))
    assert not use_blocks(torch.randn(4, 8, dtype=torch.bfloat16))


def test_zero_rows_on_a_fresh_thread():
    """An empty batch (a step with no row to sample) on a thread that never ran the kernel: the
    kernel's per-thread buffers are still empty, and 0 rows must still be a [0, n] answer."""
    w = pack_panels(from_gguf(random_gguf("Q4_0", 48, 64, 1), "Q4_0"))
    out: list = []
    t = threading.Thread(target=lambda: out.append(block_linear(torch.empty(0, 64), w)))
    t.start()
    t.join()
    assert out and out[0].shape == (0, 48)


def test_block_path_row_limit():
    """Any number of float32 rows where AMX tiles take the wide ones; on the vector paths WIDE_ROWS where they
    compute about as fast as float32 FMAs (timed once at start-up), else BLOCK_MAX_ROWS."""
    amx = library().block_gemm_amx_rows() > 0
    limit = block_rows_limit()
    assert limit is None if amx else limit in (BLOCK_MAX_ROWS, WIDE_ROWS)
    assert use_blocks(torch.randn(BLOCK_MAX_ROWS, 8))
    assert use_blocks(torch.randn(2048, 8)) == amx
    if limit is not None:
        assert use_blocks(torch.randn(limit, 8)) and not use_blocks(torch.randn(limit + 1, 8))


def test_block_over_dense_time_times_both_sides():
    """The start-up probe returns a ratio of two measured times (positive, finite) for any row count."""
    for rows in (1, 9):
        ratio = block_over_dense_time(library(), rows=rows, reps=2)
        assert 0.0 < ratio < float("inf")


def test_smollm2_decodes_through_block_weights(smollm2_path):
    """The default model's every matrix gets a block copy (so its logits test covers the kernel)."""
    from radixgen.runtime.config import EngineConfig
    from radixgen.runtime.executor.model_runner import ModelRunner

    runner = ModelRunner(EngineConfig(max_total_tokens=64, max_running_requests=1))
    assert runner.model.block_weight_count == 4 * runner.model_config.num_layers + 1
    off = ModelRunner(EngineConfig(max_total_tokens=64, max_running_requests=1, disable_block_kernels=True))
    assert off.model.block_weight_count == 0
