"""radixgen: a structured-generation language for LLM programs and the runtime that executes it.

`import radixgen as sgl` gives SGLang's frontend surface (function, gen, select, roles, REGEX_*,
global_config, ...). The heavy parts load on first use: `radixgen.Engine` (torch), `Runtime`,
`RuntimeEndpoint`, `OpenAI`.
"""

from __future__ import annotations

import importlib
from typing import Any

from radixgen.lang.api import (
    Function,
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    get_server_info,
    greedy_token_selection,
    image,
    select,
    separate_reasoning,
    set_default_backend,
    system,
    system_begin,
    system_end,
    token_length_normalized,
    unconditional_likelihood_normalized,
    user,
    user_begin,
    user_end,
    video,
)
from radixgen.lang.global_config import global_config
from radixgen.lang.interpreter import ProgramError, ProgramState
from radixgen.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

__version__ = "0.1.0"

_LAZY = {
    "Engine": ("radixgen.runtime.engine", "Engine"),
    "Runtime": ("radixgen.lang.runtime", "Runtime"),
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
    "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "Engine", "Function", "OpenAI", "ProgramError",
    "ProgramState", "Runtime", "RuntimeEndpoint", "assistant", "assistant_begin", "assistant_end", "flush_cache",
    "function", "gen", "gen_int", "gen_string", "get_default_backend", "get_server_info", "global_config",
    "greedy_token_selection", "image", "select", "separate_reasoning", "set_default_backend", "system",
    "system_begin", "system_end",
    "token_length_normalized", "unconditional_likelihood_normalized", "user", "user_begin", "user_end", "video",
]
