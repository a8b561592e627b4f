"""Compiling the C kernels (`csrc/*.c`) on first use into one shared library.

All the files are built together (so a C function can call another file's, e.g. `decode_layers`
runs a whole decode step through the GEMM, attention and layer-op kernels) with the system C
compiler (`CC`, default `cc`), into the user cache, keyed by the sources, headers, flags and CPU
flags, so later runs just load it. Two variants: `native` (`-march=native`: the SIMD paths this CPU
has) and `scalar` (`-DRADIXGEN_SCALAR`, no SIMD: the reference the tests diff the native build
against). torch is imported first, so the library shares torch's OpenMP runtime (same soname, one
thread team) instead of starting a second one. `ffi.py` loads and binds the result.
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

import torch  # noqa: F401  (loads libgomp before any kernel library)

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
COMMON_FLAGS = ["-fopenmp", "-shared", "-fPIC", "-Wl,-Bsymbolic"]  # Bsymbolic: calls between kernels stay
# inside their own library when both variants are loaded in one process
VARIANT_FLAGS = {"native": ["-O3", "-march=native"], "scalar": ["-O2", "-DRADIXGEN_SCALAR"]}


def _sources() -> list[Path]:
    return sorted(CSRC.glob("*.c"))


def _build_key(cc: str, flags: list[str]) -> str:
    h = hashlib.sha256()
    for path in [*_sources(), *sorted(CSRC.glob("*.h"))]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(" ".join([cc, *flags, platform.machine()]).encode())
    try:  # -march=native: the binary is for this CPU model
        cpu_flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        h.update(cpu_flags.encode())
    except (OSError, StopIteration):
        pass
    return h.hexdigest()[:16]


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
