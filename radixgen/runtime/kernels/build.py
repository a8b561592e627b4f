"""Compiling the C kernels (`csrc/*.c`) on first use into one shared library.

All the files are built together (so a C function can call another file's, e.g. `decode_layers`
runs a whole decode step through the GEMM, attention and layer-op kernels) with the system C
compiler (`CC`, default `cc`), into the user cache, keyed by the sources, headers, flags and CPU
flags, so later runs just load it. Two variants: `native` (`-march=native`: the SIMD paths this CPU
has) and `scalar` (`-DRADIXGEN_SCALAR`, no SIMD: the reference the tests diff the native build
against); tests also build the narrower SIMD paths this CPU can run (`PATH_VARIANTS`). The kernels
run on their own threads (`csrc/thread_pool.c`), not OpenMP, so torch's OpenMP teams, the user's
included, do not slow them. `ffi.py` loads and binds the result.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
COMMON_FLAGS = ["-pthread", "-shared", "-fPIC", "-Wl,-Bsymbolic"]  # Bsymbolic: calls between kernels stay
# inside their own library when both variants are loaded in one process
VARIANT_FLAGS = {"native": ["-O3", "-march=native"], "scalar": ["-O2", "-DRADIXGEN_SCALAR"]}
# Builds of the narrower SIMD paths, for tests on a CPU that has more (each is diffed against the
# scalar build where this CPU can run it): the CPU flags each needs, and its compiler flags.
PATH_VARIANTS = {
    "avx2": ({"avx2", "fma", "f16c"}, ["-O3", "-march=haswell"]),
    "avx-vnni": ({"avx2", "fma", "f16c", "avx_vnni"}, ["-O3", "-march=alderlake"]),
    "avx512-vnni": ({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}, ["-O3", "-march=icelake-server"]),
}
VARIANT_FLAGS.update({name: flags for name, (_, flags) in PATH_VARIANTS.items()})


def _sources() -> list[Path]:
    return sorted(CSRC.glob("*.c"))


def _build_key(cc: str, flags: list[str]) -> str:
    h = hashlib.sha256()
    for path in [*_sources(), *sorted(CSRC.glob("*.h"))]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(" ".join([cc, *flags, platform.machine()]).encode())
    h.update(" ".join(sorted(cpu_flags())).encode())  # -march=native: the binary is for this CPU model
    return h.hexdigest()[:16]


@functools.cache
def cpu_flags() -> set[str]:
    """This CPU's feature flags from /proc/cpuinfo (x86 "flags", Arm64 "Features"; empty where there is none)."""
    try:
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith(("flags", "Features")))
    except (OSError, StopIteration):
        return set()
    return set(line.split(":", 1)[1].split())


@functools.cache
def build(variant: str = "native") -> Path | None:
    """The shared library of all `csrc/*.c` in `variant`, built once per sources and CPU (None if
    no compiler can build it: callers then keep their torch path)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        logger.warning("no C compiler found (set CC): the C kernels are off, torch fallbacks only")
        return None
    flags = VARIANT_FLAGS[variant] + COMMON_FLAGS
    root = Path(os.environ.get("RADIXGEN_CACHE", Path.home() / ".cache" / "radixgen")) / "kernels"
    out = root / f"radixgen-{variant}-{_build_key(cc, flags)}.so"
    if not out.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}.so")
        sources = [str(p) for p in _sources()]
        logger.info("building the C kernels (%s) with %s (first run on this CPU, ~10-30 s) into %s", variant, cc, out)
        t0 = time.perf_counter()
        proc = subprocess.run([cc, *flags, *sources, "-o", str(tmp), "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            logger.warning("building the C kernels (%s) failed, they are off:\n%s", variant, proc.stderr[-2000:])
            return None
        os.replace(tmp, out)
        logger.info("built the C kernels in %.1f s", time.perf_counter() - t0)
    return out
