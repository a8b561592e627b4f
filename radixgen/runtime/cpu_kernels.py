"""Our C kernels for CPU (`csrc/*.c`), compiled on first use and loaded with ctypes.

Each file is built with the system C compiler (`CC`, default `cc`) for this CPU (`-march=native`,
OpenMP) into the user cache, keyed by the source, flags and CPU flags, so later runs just load it.
torch is imported first, so the library shares torch's OpenMP runtime (same soname, one thread
team) instead of starting a second one. ctypes releases the GIL for the call. `load` returns None
when no compiler can build the file; callers then keep their torch path.
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
from pathlib import Path
from typing import Any

import torch  # noqa: F401  (loads libgomp before any kernel library)

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]


def _build_key(source: Path, cc: str) -> str:
    h = hashlib.sha256(source.read_bytes())
    for header in sorted(CSRC.glob("*.h")):
        h.update(header.read_bytes())
    h.update(" ".join([cc, *FLAGS, platform.machine()]).encode())
    try:  # -march=native: the binary is for this CPU model
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        h.update(flags.encode())
    except (OSError, StopIteration):
        pass
    return h.hexdigest()[:16]


Signatures = dict[str, tuple[Any, list[Any]]]  # function name -> (ctypes restype, argtypes)


def load(name: str, signatures: Signatures) -> ctypes.CDLL | None:
    """The compiled `csrc/<name>.c` with `signatures` bound to its functions, or None if it cannot be
    built. Callers cache the result (one `functools.cache`d accessor per library)."""
    path = _build(name)
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    for fn, (restype, argtypes) in signatures.items():
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
    return lib


@functools.cache
def _build(name: str) -> Path | None:
    """The shared library of `csrc/<name>.c`, built once per source and CPU (None if that fails)."""
    source = CSRC / f"{name}.c"
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        logger.warning("no C compiler found (set CC): %s is off, torch fallbacks only", name)
        return None
    root = Path(os.environ.get("RADIXGEN_CACHE", Path.home() / ".cache" / "radixgen")) / "kernels"
    out = root / f"{name}-{_build_key(source, cc)}.so"
    if not out.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}.so")
        proc = subprocess.run([cc, *FLAGS, str(source), "-o", str(tmp), "-lm"], capture_output=True, text=True)
        if proc.returncode != 0:
            logger.warning("building %s failed, it is off:\n%s", source.name, proc.stderr[-2000:])
            return None
        os.replace(tmp, out)
    return out
