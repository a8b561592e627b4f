"""Which backend a program runs on: the default backend and the objects accepted as a backend.

`as_backend` takes a `Backend` as is, a `Runtime` (its endpoint), or an in-process Engine (anything
with `.generate` and `.tokenizer`), which it wraps once in an `EngineBackend`. Kept apart from
base.py so the interface module imports no concrete backend.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from radixgen.lang.backends.base import Backend
from radixgen.lang.backends.engine import EngineBackend

_default_backend: Backend | None = None
_wrapped: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_wrap_lock = threading.Lock()


def as_backend(obj: Any) -> Backend:
    """A Backend as is; a Runtime's endpoint; a runtime Engine wrapped once (one wrapper per engine)."""
    if isinstance(obj, Backend):
        return obj
    endpoint = getattr(obj, "endpoint", None)
    if isinstance(endpoint, Backend):  # sgl.Runtime(...)
        return endpoint
    if hasattr(obj, "generate") and hasattr(obj, "tokenizer"):
        with _wrap_lock:
            try:
                b = _wrapped.get(obj)
            except TypeError:
                return EngineBackend(obj)
            if b is None:
                b = _wrapped[obj] = EngineBackend(obj)
            return b
    raise TypeError(f"not a backend: {type(obj).__name__}; pass sgl.Engine(...), sgl.Runtime(...), "
                    f"sgl.RuntimeEndpoint(url) or sgl.OpenAI(model)")


def set_default_backend(backend: Any) -> None:
    """Use `backend` for programs run without backend=... (an Engine, Runtime, RuntimeEndpoint or OpenAI)."""
    global _default_backend
    _default_backend = None if backend is None else as_backend(backend)


def get_default_backend() -> Backend | None:
    return _default_backend


def resolve_backend(backend: Any) -> Backend:
    """`backend` as a Backend, or the default one; a clear error when there is none."""
    if backend is not None:
        return as_backend(backend)
    if _default_backend is None:
        raise ValueError("no backend: call sgl.set_default_backend(sgl.Engine()) or pass backend=... to run()")
    return _default_backend
