"""`sgl.global_config`: SGLang's process-wide frontend settings, under SGLang's names.

Fields (each is read where it acts; setting an unknown name raises AttributeError):

- `verbosity` (0): at 2 or more, every `run()` prints the program's final text.
- `default_backend`: the default backend as it was given (the same as `set_default_backend` /
  `get_default_backend`): after `set_default_backend(sgl.Runtime(...))` it is that Runtime.
- `skip_special_tokens_in_output` (True): gens drop special tokens from their text (the engine's
  `skip_special_tokens`).
- `enable_precache_with_tracing` (True): `run_batch` traces the program and prefills its constant
  prefix once before running the batch.
- `enable_parallel_encoding` (True): in SGLang, `join("concate_and_append")` splices the branches'
  KV caches on the server. radixgen appends the branches' text either way; the shared prefix is
  already cached and the branch texts are prefilled by the parent's next call, so the result is the
  same text, computed exactly (SGLang's splice reuses KV computed at other positions).
- `spaces_between_special_tokens_in_out` (True): SGLang's detokenizer option; HF fast tokenizers,
  which radixgen uses, never insert such spaces, in SGLang as here, so both values give the same text.
"""

from __future__ import annotations

from typing import Any

from radixgen.lang.backends.default import get_default_backend, set_default_backend

_FIELDS: dict[str, type] = {
    "verbosity": int,
    "skip_special_tokens_in_output": bool,
    "spaces_between_special_tokens_in_out": bool,
    "enable_precache_with_tracing": bool,
    "enable_parallel_encoding": bool,
}


class GlobalConfig:
    """Process-wide settings of the program language (see the module docstring)."""

    def __init__(self) -> None:
        self.verbosity = 0
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True

    @property
    def default_backend(self) -> Any:
        return get_default_backend()

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        set_default_backend(backend)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "default_backend":
            object.__setattr__(self, name, value)  # the property setter
            return
        kind = _FIELDS.get(name)
        if kind is None:
            raise AttributeError(f"global_config has no setting {name!r}; settings: "
                                 f"{', '.join(sorted([*_FIELDS, 'default_backend']))}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"global_config.{name} must be a {kind.__name__}, got {value!r}")
        object.__setattr__(self, name, value)


global_config = GlobalConfig()
