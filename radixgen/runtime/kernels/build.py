"""Our C kernels for CPU (`csrc/*.c`), compiled on first use and loaded with ctypes.

All the files are built together into one shared library (so a C function can call another file's,
e.g. `decode_layers` runs a whole decode step through the GEMM, attention and layer-op kernels)
with the system C compiler (`CC`, default `cc`) for this CPU (`-march=native`, OpenMP), into the
user cache, keyed by the sources, headers, flags and CPU flags, so later runs just load it. torch is
imported first, so the library shares torch's OpenMP runtime (same soname, one thread team)
instead of starting a second one. ctypes releases the GIL for the call. `load` returns None when no
compiler can build it; callers then keep their torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (loads libgomp before any kernel library)

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


def _sources() -> list[Path]:
    return sorted(CSRC.glob("*.c"))


def _build_key(cc: str) -> str:
    h = hashlib.sha256()
    for path in [*_sources(), *sorted(CSRC.glob("*.h"))]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(" ".join([cc, *FLAGS, platform.machine()]).encode())
    try:  # -march=native: the binary is for this CPU model
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        h.update(flags.encode())
    except (OSError, StopIteration):
        pass
    return h.hexdigest()[:16]


Signatures = dict[str, tuple[Any, list[Any]]]  # function name -> (ctypes restype, argtypes)


def load(signatures: Signatures) -> ctypes.CDLL | None:
    """The compiled kernels with `signatures` bound to their functions, or None if they cannot be
    built. Callers cache the result (one `functools.cache`d accessor per Python module)."""
    path = _build()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    for fn, (restype, argtypes) in signatures.items():
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
    return lib


@functools.cache
def _build() -> Path | None:
    """The shared library of all `csrc/*.c`, built once per sources and CPU (None if that fails)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        logger.warning("no C compiler found (set CC): the C kernels are off, torch fallbacks only")
        return None
    root = Path(os.environ.get("RADIXGEN_CACHE", Path.home() / ".cache" / "radixgen")) / "kernels"
    out = root / f"radixgen-{_build_key(cc)}.so"
    if not out.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}.so")
        sources = [str(p) for p in _sources()]
        logger.info("building the C kernels with %s (first run on this CPU, ~10-30 s) into %s", cc, out)
        t0 = time.perf_counter()
        proc = subprocess.run([cc, *FLAGS, *sources, "-o", str(tmp), "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            logger.warning("building the C kernels failed, they are off:\n%s", proc.stderr[-2000:])
            return None
        os.replace(tmp, out)
        logger.info("built the C kernels in %.1f s", time.perf_counter() - t0)
    return out
