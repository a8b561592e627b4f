"""Which backend a program runs on: the default backend and the objects accepted as a backend.

`as_backend` takes a `Backend` as is, a `Runtime` (its endpoint), or an in-process Engine (anything
with `.generate` and `.tokenizer`), which it wraps once in an `EngineBackend`. The default backend is
kept as it was given (SGLang's `global_config.default_backend` is the user's object) beside the
Backend it resolves to. Kept apart from base.py so the interface module imports no concrete backend.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from radixgen.lang.backends.base import Backend
from radixgen.lang.backends.engine import EngineBackend

# (what set_default_backend got, as SGLang keeps it: a Runtime stays a Runtime; the same as a Backend),
# replaced as one tuple so a reader never sees one half of an old pair
_default: tuple[Any, Backend | None] = (None, None)
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
    """Use `backend` for programs run without backend=... (an Engine, Runtime, RuntimeEndpoint or OpenAI).

    The object is kept as given, as SGLang keeps it: after `set_default_backend(sgl.Runtime(...))`,
    `get_default_backend()` (and `sgl.global_config.default_backend`) is that Runtime, so its
    `.endpoint` reaches the server; programs run on the Backend it stands for."""
    global _default
    _default = (backend, None if backend is None else as_backend(backend))  # a non-backend fails here


def get_default_backend() -> Any:
    """The default backend as it was given to `set_default_backend` (None when unset)."""
    return _default[0]


def resolve_backend(backend: Any) -> Backend:
    """`backend` as a Backend, or the default one; a clear error when there is none."""
    if backend is not None:
        return as_backend(backend)
    default = _default[1]
    if default is None:
        raise ValueError("no backend: call sgl.set_default_backend(sgl.Engine()) or pass backend=... to run()")
    return default
