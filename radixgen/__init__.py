"""radixgen: a structured-generation language for LLM programs and the runtime that executes it.

`import radixgen as sgl` gives SGLang's frontend surface (function, gen, select, roles, ...).
The heavy parts load on first use: `radixgen.Engine` (torch), `RuntimeEndpoint`, `OpenAI`.
"""

from __future__ import annotations

import importlib
from typing import Any

from radixgen.lang.api import (
    Function,
    assistant,
    assistant_begin,
    assistant_end,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    greedy_token_selection,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    token_length_normalized,
    unconditional_likelihood_normalized,
    user,
    user_begin,
    user_end,
)
from radixgen.lang.interpreter import ProgramError, ProgramState

__version__ = "0.1.0"

_LAZY = {
    "Engine": ("radixgen.runtime.engine", "Engine"),
    "RuntimeEndpoint": ("radixgen.lang.backends.endpoint", "RuntimeEndpoint"),
    "OpenAI": ("radixgen.lang.backends.openai", "OpenAI"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'radixgen' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Engine", "Function", "OpenAI", "ProgramError", "ProgramState", "RuntimeEndpoint", "assistant",
    "assistant_begin", "assistant_end", "function", "gen", "gen_int", "gen_string", "get_default_backend",
    "greedy_token_selection", "select", "set_default_backend", "system", "system_begin", "system_end",
    "token_length_normalized", "unconditional_likelihood_normalized", "user", "user_begin", "user_end",
]
