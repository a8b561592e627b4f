"""Giving freed heap pages back to the OS.

glibc's malloc keeps freed heap memory mapped for reuse, so the temporaries of one large parse (a
request body, a tokenizer's JSON, a grammar backend's vocabulary tables) stay in the process's RSS
after they are freed. `malloc_trim(0)` returns the free pages; it is a glibc function, called through
ctypes, and a no-op elsewhere (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util


def _libc_malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_MALLOC_TRIM = _libc_malloc_trim()
TRIM_AVAILABLE = _MALLOC_TRIM is not None  # whether release_free_memory does anything here


def release_free_memory() -> bool:
    """Return free heap pages to the OS (glibc `malloc_trim(0)`); False where unavailable."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
