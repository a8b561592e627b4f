"""The kernels' Arm64 NEON paths (`RG_NEON`: the dot-product extension, Armv8.2) against the Arm64
scalar build, both cross-compiled and run under qemu-user: `arm64/kernel_driver.c` runs one case on
seeded inputs and writes its outputs, the same way test_kernel_reference diffs the x86 SIMD builds.
Needs `aarch64-linux-gnu-gcc` and `qemu-aarch64` (Debian/Ubuntu: gcc-aarch64-linux-gnu qemu-user;
`.ci/run` installs them where it can)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from radixgen.runtime.kernels import build

CC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
pytestmark = pytest.mark.skipif(CC is None or QEMU is None,
                                reason="no aarch64 cross compiler and qemu-aarch64 (gcc-aarch64-linux-gnu, qemu-user)")

DRIVER = Path(__file__).parent / "arm64" / "kernel_driver.c"
FLAGS = {"neon": ["-O3", "-march=armv8.2-a+dotprod"], "scalar": ["-O2", "-DRADIXGEN_SCALAR"]}


@pytest.fixture(scope="module")
def drivers(tmp_path_factory) -> dict[str, Path]:
    """The driver linked (statically: qemu then needs no Arm64 sysroot) with each build of the kernels."""
    out = tmp_path_factory.mktemp("arm64")
    csrc = Path(build.__file__).parent / "csrc"
    exes = {}
    for name, flags in FLAGS.items():
        exe = out / f"driver-{name}"
        subprocess.run([CC, *flags, "-static", "-pthread", f"-I{csrc}", *map(str, sorted(csrc.glob("*.c"))),
                        str(DRIVER), "-o", str(exe), "-lm"], check=True, capture_output=True, timeout=300)
        exes[name] = exe
    return exes


def run(exe: Path, *args: object) -> np.ndarray:
    done = subprocess.run([QEMU, str(exe), *map(str, args)], capture_output=True, check=True, timeout=300)
    return np.frombuffer(done.stdout, dtype=np.float32)


def assert_close(simd: np.ndarray, ref: np.ndarray, tol: float = 1e-5) -> None:
    assert simd.shape == ref.shape and ref.size > 0
    assert np.abs(simd - ref).max() <= tol * max(1.0, float(np.abs(ref).max()))


def test_the_neon_build_runs_the_neon_paths(drivers):
    levels = {name: int(subprocess.run([QEMU, str(exe), "level"], capture_output=True, text=True,
                                       check=True).stdout) for name, exe in drivers.items()}
    assert levels == {"neon": 16, "scalar": 0}  # RG_BIT_NEON; simd_path() names it "neon-dotprod"


# csrc/block_format.h: fp16 Q4/Q8, float32 scales, K-quants' own; 7: Q4_0's offset format (the driver's code)
@pytest.mark.parametrize("fmt", range(8))
@pytest.mark.parametrize("m", [1, 3, 8, 9, 17])
def test_block_gemm(drivers, fmt, m):
    """sdot panels (the fp16 formats; the others on the reference path in the NEON build) against the
    scalar sums: 8-row passes and their tails, a partial last panel (37 rows)."""
    case = ("gemm", fmt, m, 512 if fmt in (5, 6) else 96, 37, m, 3)
    assert_close(run(drivers["neon"], *case), run(drivers["scalar"], *case))


@pytest.mark.parametrize("fmt", [0, 1, 7])  # the sdot panels' formats: a min, signed q, an offset
@pytest.mark.parametrize("limbs", [1, 2])
def test_block_gemm_fewer_limbs(drivers, fmt, limbs):
    """Long prompt chunks' one or two activation limbs: whole 8-row tiles and a partial one."""
    case = ("gemm", fmt, 13, 96, 37, limbs, limbs)
    assert_close(run(drivers["neon"], *case), run(drivers["scalar"], *case))


@pytest.mark.parametrize("kv", [0, 1, 2, 3])  # float32, bfloat16, float16, int8 K/V
@pytest.mark.parametrize("heads,kv_heads,head_dim,keys", [(9, 3, 64, 300), (8, 2, 40, 2100)])
def test_decode_attention(drivers, kv, heads, kv_heads, head_dim, keys):
    """Three requests of different lengths at scattered slots (2,100 keys: 256-key chunks)."""
    case = ("attention", kv, 3, heads, kv_heads, head_dim, keys, keys)
    assert_close(run(drivers["neon"], *case), run(drivers["scalar"], *case))


@pytest.mark.parametrize("op,width", [("norm", 576), ("norm", 99), ("silu", 1536), ("silu", 37)])
def test_layer_ops(drivers, op, width):
    """RMSNorm with its residual add, and SiLU * up (NEON exp): vector bodies and scalar tails."""
    case = (op, 5, width, width)
    assert_close(run(drivers["neon"], *case), run(drivers["scalar"], *case))
