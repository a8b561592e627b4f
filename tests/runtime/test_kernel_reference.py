"""Every C kernel's SIMD builds against its scalar reference build (-DRADIXGEN_SCALAR), and the C
boundary's declarations: the ctypes bindings come from the header, the struct mirrors are checked
against it.

The SIMD builds: the native one (-march=native, what the engine runs) and each narrower path this
CPU can also run (AVX2, AVX-VNNI, AVX-512 VNNI; `build.PATH_VARIANTS`), so a CPU with AVX-512 tests
the AVX2 code too. They run the same algorithms as the scalar build; they may differ by FMA
contraction, summation order and the vector exp approximation (~1e-7 relative), so results are
compared to float tolerance, on shapes that cover the vector tails (dimensions not a multiple of 8
or 16, partial panels, odd head groups).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from radixgen.radix_cache import kv_quant
from radixgen.runtime.kernels import build, ffi, layer_ops
from radixgen.runtime.kernels import decode_attention as attn
from radixgen.runtime.kernels.block_gemm import block_linear, pack_panels
from radixgen.runtime.kernels.decode_layers import DecodeDims, DecodeLayers, LayerWeights, WindowKeys
from radixgen.runtime.kernels.gguf_blocks import from_gguf
from tests.runtime.test_block_gemm import ALL_TYPES, SIMD_BUILDS, random_gguf, simd_build_or_skip, width
from tests.runtime.test_cpu_attention import kv_buffer

pytestmark = pytest.mark.skipif(ffi.library() is None or ffi.load("scalar") is None,
                                reason="no C compiler to build the kernels")


@pytest.fixture(scope="module", params=SIMD_BUILDS)
def libs(request) -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(a SIMD build, the scalar build)."""
    lib = simd_build_or_skip(request.param)
    lib.variant = request.param
    return lib, ffi.load("scalar")


def expected_paths(variant: str, flags: set[str]) -> set[str]:
    """The SIMD paths a build should report, from the CPU's own flags (native) or the build's target."""
    if variant != "native":
        return {"avx2", variant}
    paths = set()
    if {"asimd", "asimddp"} <= flags:  # Arm64 with the dot-product extension
        paths.add("neon-dotprod")
    if {"avx2", "fma", "f16c"} <= flags:
        paths.add("avx2")
        if "avx_vnni" in flags:
            paths.add("avx-vnni")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags:
            paths.add("avx512-vnni")
            if {"amx_tile", "amx_int8", "amx_bf16", "avx512_bf16"} <= flags:
                paths.add("amx")
    return paths


def test_the_builds_run_different_paths(libs):
    """Each SIMD build takes the paths its target has (the native one: this CPU's, as /proc/cpuinfo
    lists them), so the diffs below compare different code paths."""
    assert ffi.simd_path(libs[1]) == "scalar"
    assert ffi.simd_features(libs[0]) == expected_paths(libs[0].variant, build.cpu_flags())


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("qtype", ALL_TYPES)
@pytest.mark.parametrize("m", [1, 3, 16, 17, 20, 40, 130])
def test_block_gemm(libs, qtype, m):
    """Native from block_gemm_amx_rows() rows on runs the AMX tiles (a whole tile, partial ones, an odd
    number of them); below, and in the other builds, the vector paths."""
    n, k = 37, width(qtype)  # a partial last panel
    w = pack_panels(from_gguf(random_gguf(qtype, n, k, seed=m), qtype))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    close(block_linear(x, w, libs[0]), block_linear(x, w, libs[1]))


@pytest.mark.parametrize("qtype", ALL_TYPES)
@pytest.mark.parametrize("limbs", [1, 2])
@pytest.mark.parametrize("m", [13, 40])
def test_block_gemm_fewer_limbs(libs, qtype, limbs, m):
    """Two activation limbs or one (long prompt chunks, `wide_matmul_dtype` int16 / int8): whole 8-row
    tiles and a partial one, and from block_gemm_amx_rows() rows on AMX tiles (two whole, one partial), in
    every build."""
    n, k = 37, width(qtype)
    w = pack_panels(from_gguf(random_gguf(qtype, n, k, seed=limbs), qtype))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(limbs))
    close(block_linear(x, w, libs[0], limbs=limbs), block_linear(x, w, libs[1], limbs=limbs))


def _table(batch: int, lens: list[int], n_slots: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    free = torch.randperm(n_slots - 1, generator=g) + 1
    table = torch.zeros(batch + 1, max(lens) + 3, dtype=torch.int64)
    rows = torch.randperm(batch + 1, generator=g)[:batch]
    start = 0
    for r, n in zip(rows.tolist(), lens, strict=True):
        table[r, :n] = free[start : start + n]
        start += n
    return table, rows


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (6, 1, 18), (4, 4, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
def test_decode_attention(libs, heads, kv_heads, head_dim, dtype):
    g = torch.Generator().manual_seed(heads + head_dim)
    lens = [1, 13, 40, 7]
    n_slots = sum(lens) + 5
    k = kv_buffer(torch.randn(n_slots, kv_heads, head_dim, generator=g) * 2, dtype)
    v = kv_buffer(torch.randn(n_slots, kv_heads, head_dim, generator=g), dtype)
    q = torch.randn(len(lens), heads, head_dim, generator=g)
    table, rows = _table(len(lens), lens, n_slots, g)
    seq = torch.tensor(lens)
    native = attn.decode_attention(q, k, v, table, rows, seq, 0.3, return_lse=True, lib=libs[0])
    scalar = attn.decode_attention(q, k, v, table, rows, seq, 0.3, return_lse=True, lib=libs[1])
    for a, b in zip(native, scalar, strict=True):
        close(a, b)


@pytest.mark.parametrize("heads,kv_heads,head_dim,batch", [(9, 3, 64, 16), (6, 2, 18, 3), (4, 1, 16, 30)])
def test_shared_prefix_attention(libs, heads, kv_heads, head_dim, batch):
    g = torch.Generator().manual_seed(batch)
    c = 70
    own = [i % 5 + 1 for i in range(batch)]
    n_slots = c + sum(own) + 3
    k = torch.randn(n_slots, kv_heads, head_dim, generator=g) * 2
    v = torch.randn(n_slots, kv_heads, head_dim, generator=g)
    q = torch.randn(batch, heads, head_dim, generator=g)
    free = torch.randperm(n_slots - 1, generator=g) + 1
    table = torch.zeros(batch, c + max(own) + 1, dtype=torch.int64)
    start = c
    for r, n in enumerate(own):
        table[r, :c] = free[:c]
        table[r, c : c + n] = free[start : start + n]
        start += n
    rows, seq = torch.arange(batch), torch.tensor(own) + c
    out = [attn.shared_prefix_decode_attention(q, k, v, table, rows, seq, free[:c], 0.2, lib=lib) for lib in libs]
    close(out[0], out[1])


@pytest.mark.parametrize("n", [7, 64, 576])
def test_layer_ops(libs, n):
    g = torch.Generator().manual_seed(n)
    h, delta, w = torch.randn(5, n, generator=g), torch.randn(5, n, generator=g), torch.rand(n, generator=g)
    outs = []
    for lib in libs:
        hh = h.clone()
        outs.append((hh, layer_ops.add_rms_norm(hh, w, 1e-5, delta=delta, lib=lib),
                     layer_ops.silu_mul(torch.cat([h, delta], 1), lib=lib),
                     layer_ops.gelu_mul(torch.cat([h, delta], 1) * 3, lib=lib)))
    for a, b in zip(*outs, strict=True):
        close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store(libs, dtype, qk_norm):
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, d, t = 6, 2, 18, 5
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g)
    cos, sin = torch.rand(64, d // 2, generator=g), torch.rand(64, d // 2, generator=g)
    positions, loc = torch.tensor([0, 3, 63, 9, 9]), torch.tensor([4, 1, 7, 2, 5])
    norms = {"q_norm": torch.rand(d, generator=g) + 0.5, "k_norm": torch.rand(d, generator=g) + 0.5} if qk_norm else {}
    results = []
    for lib in libs:
        width = d + 4 if dtype == torch.int8 else d
        kb, vb = (torch.zeros(9, kv_heads, width, dtype=dtype) for _ in range(2))
        x = qkv.clone()
        layer_ops.rope_store(x, heads, kv_heads, cos, sin, positions, loc, kb, vb, **norms, lib=lib)
        results.append((x, kb, vb))
    for a, b in zip(*results, strict=True):
        if a.dtype == torch.int8:  # the rotated k may differ by FMA rounding: within one int8 step
            va, vb_ = (kv_quant.dequantize(t, torch.float32) for t in (a, b))
            step = va.abs().amax(-1, keepdim=True) / 127
            assert ((va - vb_).abs() <= step * 1.01 + 1e-6).all()
        else:
            close(a.float(), b.float())


@pytest.mark.parametrize("shared", [0, 12])
@pytest.mark.parametrize("gemma", [False, True])
def test_decode_layers(libs, shared, gemma):
    """Two synthetic layers on random block weights: the whole C decode step, native vs scalar; with
    `gemma`, Gemma 3's parts (q/k norms, output norms, GeGLU; the first layer windowed over each token's
    last 5 keys with its own rotary table)."""
    hidden, heads, kv_heads, d, inter, batch = 64, 4, 2, 16, 96, 3
    g = torch.Generator().manual_seed(shared)

    def weight(n: int, k: int, seed: int):
        return pack_panels(from_gguf(random_gguf("Q4_1", n, k, seed), "Q4_1"))

    n_slots = 64
    k_bufs = [torch.randn(n_slots, kv_heads, d, generator=g) for _ in range(2)]
    v_bufs = [torch.randn(n_slots, kv_heads, d, generator=g) for _ in range(2)]
    layers = [LayerWeights(torch.rand(hidden, generator=g) + 0.5, torch.rand(hidden, generator=g) + 0.5,
                           k_bufs[i], v_bufs[i], weight((heads + 2 * kv_heads) * d, hidden, 10 * i),
                           weight(hidden, heads * d, 10 * i + 1), weight(2 * inter, hidden, 10 * i + 2),
                           weight(hidden, inter, 10 * i + 3)) for i in range(2)]
    if gemma:
        for i, layer in enumerate(layers):
            layer.q_norm, layer.k_norm = (torch.rand(d, generator=g) + 0.5 for _ in range(2))
            layer.attn_out_norm, layer.mlp_out_norm = (torch.rand(hidden, generator=g) + 0.5 for _ in range(2))
            layer.gelu, layer.local = True, i == 0
    step = DecodeLayers(layers, DecodeDims(heads, kv_heads, d, inter, 1e-5, d**-0.5), max_rows=batch)
    own = [4, 9, 1]
    table = torch.zeros(batch, 32, dtype=torch.int64)
    slots = torch.randperm(n_slots - 1, generator=g) + 1
    start = shared
    for r, n in enumerate(own):
        table[r, :shared] = slots[:shared]
        table[r, shared : shared + n] = slots[start : start + n]
        start += n
    seq = torch.tensor(own) + shared
    positions, loc = seq - 1, table[torch.arange(batch), seq - 1]
    cos, sin = torch.rand(64, d // 2, generator=g), torch.rand(64, d // 2, generator=g)
    h0 = torch.randn(batch, hidden, generator=g)
    local = {}
    if gemma:
        lo = (seq - 5).clamp(min=0)
        win = torch.stack([table[r, lo[r] + torch.arange(5).clamp(max=seq[r] - 1 - lo[r])] for r in range(batch)])
        local = {"local_cos": torch.rand(64, d // 2, generator=g), "local_sin": torch.rand(64, d // 2, generator=g),
                 "window": WindowKeys(win, torch.arange(batch), seq - lo)}
    out = []
    for lib in libs:
        h = h0.clone()
        step.run(h, positions, loc, cos, sin, table, torch.arange(batch), seq, slots[:shared] if shared else None,
                 **local, lib=lib)
        out.append(h)
    close(out[0], out[1], tol=1e-4)


def test_bindings_come_from_the_header(libs):
    protos = ffi.prototypes()
    assert set(protos) >= {"block_gemm", "decode_attention", "shared_prefix_attention", "add_rms_norm", "silu_mul",
                           "gelu_mul", "rope_store", "decode_layers"}
    for name, (restype, argtypes) in protos.items():
        assert getattr(libs[0], name).argtypes == argtypes and getattr(libs[0], name).restype == restype
    assert protos["decode_layers"] == (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                                      ctypes.c_void_p, ctypes.c_int])


def test_a_drifted_struct_mirror_is_caught(libs, monkeypatch):
    ffi.check_structs(libs[0])

    class Drifted(ctypes.Structure):  # `bits` as a 32-bit int: the C struct's layout differs
        _fields_ = [("bits", ctypes.c_int), *ffi.BlockWeightC._fields_[1:]]

    monkeypatch.setitem(ffi.STRUCTS, "rg_block_weight", Drifted)
    with pytest.raises(RuntimeError, match="does not match struct rg_block_weight"):
        ffi.check_structs(libs[0])
