"""The user-facing language: `@function`, `gen`, `gen_int`, `gen_string`, `select`, roles, backends.

Mirrors SGLang's `sglang/api.py` so `import radixgen as sgl` runs SGLang programs (LANG_API.md).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from radixgen.lang import ir
from radixgen.lang.backends.base import get_default_backend, resolve_backend, set_default_backend
from radixgen.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixgen.lang.interpreter import ProgramState, run_program, run_program_batch
from radixgen.lang.tracer import TraceResult, extract_prefix, trace_program

__all__ = [
    "Function", "function", "gen", "gen_int", "gen_string", "select", "system", "user", "assistant",
    "system_begin", "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end",
    "set_default_backend", "get_default_backend", "token_length_normalized", "greedy_token_selection",
    "unconditional_likelihood_normalized", "dtype_regex",
]

# dtype -> regex; the same as radixgen.grammar.schema.DTYPE_REGEX (used when that package, which
# imports torch, is not loaded): int without leading zeros (<= 18 digits), Python bool, JSON string.
_DTYPE_REGEX = {
    int: r"-?(0|[1-9][0-9]{0,17})",
    float: r"-?(0|[1-9][0-9]{0,17})(\.[0-9]{1,17})?([eE][-+]?[0-9]{1,3})?",
    bool: r"(True|False)",
    str: r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"',
}
_DTYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str}


def dtype_regex(dtype: Any) -> str:
    """The regex a `gen(dtype=...)` is constrained to: int, float, bool or str (a quoted string)."""
    dtype = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in _DTYPE_REGEX:
        raise ValueError(f"dtype must be int, float, bool or str, got {dtype!r}")
    schema = sys.modules.get("radixgen.grammar.schema")
    table = getattr(schema, "DTYPE_REGEX", None) or _DTYPE_REGEX
    return table.get(dtype, _DTYPE_REGEX[dtype])


def _json_schema_str(schema: Any) -> str:
    """JSON string, dict, or pydantic model class -> JSON string (validated as JSON here)."""
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except ValueError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    if inspect.isclass(schema) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema())
    raise TypeError(f"json_schema must be a JSON string, a dict or a pydantic model class, got "
                    f"{type(schema).__name__}")


def gen(
    name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None,
    stop: str | Sequence[str] | None = None, stop_token_ids: Sequence[int] | None = None,
    temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
    min_p: float | None = None, frequency_penalty: float | None = None, presence_penalty: float | None = None,
    ignore_eos: bool | None = None, return_logprob: bool | None = None, top_logprobs_num: int | None = None,
    n: int | None = None, regex: str | None = None, json_schema: Any = None,
    choices: Sequence[str] | None = None, dtype: Any = None, choices_method: Any = None,
    token_healing: bool | None = None,
) -> ir.Expr:
    """Generate text into variable `name`; with `choices` it is a `select`."""
    if choices is not None:
        return select(name, choices, temperature=temperature or 0.0, choices_method=choices_method)
    if sum(x is not None for x in (regex, json_schema, dtype)) > 1:
        raise ValueError("give at most one of regex, json_schema and dtype")
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"invalid regex {regex!r}: {e}") from None
    if dtype is not None:
        regex = dtype_regex(dtype)
    params = ir.SamplingParams.make(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, stop=stop, stop_token_ids=stop_token_ids,
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty, ignore_eos=ignore_eos, return_logprob=return_logprob,
        top_logprobs_num=top_logprobs_num, n=n, regex=regex,
        json_schema=None if json_schema is None else _json_schema_str(json_schema), token_healing=token_healing)
    return ir.Gen(name, params)


def gen_int(name: str | None = None, **kwargs: Any) -> ir.Expr:
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> ir.Expr:
    return gen(name, dtype=str, **kwargs)


def select(name: str | None = None, choices: Sequence[str] | None = None, temperature: float = 0.0,
           choices_method: Any = token_length_normalized) -> ir.Expr:
    """Pick one of `choices` by scoring each as a continuation; see choices.py for the methods."""
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    if not all(isinstance(c, str) for c in choices):
        raise TypeError("select choices must be strings")
    return ir.Select(name, list(choices), temperature, choices_method)


def system(expr: Any = None) -> ir.Expr:
    return ir.role_expr("system", expr)


def user(expr: Any = None) -> ir.Expr:
    return ir.role_expr("user", expr)


def assistant(expr: Any = None) -> ir.Expr:
    return ir.role_expr("assistant", expr)


def system_begin() -> ir.Expr:
    return ir.RoleBegin("system")


def system_end() -> ir.Expr:
    return ir.RoleEnd("system")


def user_begin() -> ir.Expr:
    return ir.RoleBegin("user")


def user_end() -> ir.Expr:
    return ir.RoleEnd("user")


def assistant_begin() -> ir.Expr:
    return ir.RoleBegin("assistant")


def assistant_end() -> ir.Expr:
    return ir.RoleEnd("assistant")


def _run_defaults(max_new_tokens: int, min_new_tokens: int | None, n: int, stop: Any, stop_token_ids: Any,
                  temperature: float, top_p: float, top_k: int, min_p: float, frequency_penalty: float,
                  presence_penalty: float, ignore_eos: bool, return_logprob: bool,
                  top_logprobs_num: int | None) -> ir.SamplingParams:
    return ir.SamplingParams.defaults().override(ir.SamplingParams.make(
        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, n=n, stop=stop,
        stop_token_ids=stop_token_ids, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, ignore_eos=ignore_eos,
        return_logprob=return_logprob, top_logprobs_num=top_logprobs_num))


class Function:
    """A program: `run` / `run_batch` / `bind` / `trace` (made by `@function`)."""

    def __init__(self, func: Callable, bind_arguments: dict | None = None) -> None:
        self.func = func
        self.bind_arguments = dict(bind_arguments or {})
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(f"@function {func.__name__}: the first parameter must be the program state `s`")
        self.arg_names = params[1:]
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> Function:
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{self.func.__name__}() has no argument(s) {sorted(unknown)}")
        return Function(self.func, {**self.bind_arguments, **kwargs})

    def run(self, *args: Any, max_new_tokens: int = 128, min_new_tokens: int | None = None, n: int = 1,
            stop: Any = None, stop_token_ids: Any = None, temperature: float = 1.0, top_p: float = 1.0,
            top_k: int = -1, min_p: float = 0.0, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
            ignore_eos: bool = False, return_logprob: bool = False, top_logprobs_num: int | None = None,
            stream: bool = False, backend: Any = None, **kwargs: Any) -> ProgramState:
        """Run once; returns the ProgramState (at once when stream=True)."""
        defaults = _run_defaults(max_new_tokens, min_new_tokens, n, stop, stop_token_ids, temperature, top_p,
                                 top_k, min_p, frequency_penalty, presence_penalty, ignore_eos, return_logprob,
                                 top_logprobs_num)
        kwargs = {**self.bind_arguments, **kwargs}
        return run_program(self.func, resolve_backend(backend), args, kwargs, defaults, stream)

    def run_batch(self, batch_kwargs: Sequence[dict | Sequence], *, max_new_tokens: int = 128,
                  min_new_tokens: int | None = None, n: int = 1, stop: Any = None, stop_token_ids: Any = None,
                  temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0,
                  frequency_penalty: float = 0.0, presence_penalty: float = 0.0, ignore_eos: bool = False,
                  return_logprob: bool = False, top_logprobs_num: int | None = None, backend: Any = None,
                  num_threads: int | str = "auto", progress_bar: bool = False) -> list[ProgramState]:
        """Run once per item (a dict of keyword or a tuple of positional arguments); input order kept.

        The constant prefix found by tracing is prefilled once first, so every program reuses it."""
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of dicts (keyword arguments) or tuples (positional)")
        defaults = _run_defaults(max_new_tokens, min_new_tokens, n, stop, stop_token_ids, temperature, top_p,
                                 top_k, min_p, frequency_penalty, presence_penalty, ignore_eos, return_logprob,
                                 top_logprobs_num)
        be = resolve_backend(backend)
        batch = [{**self.bind_arguments, **a} if isinstance(a, dict) else a for a in batch_kwargs]
        prefix = None
        if len(batch) > 1:
            try:
                template = be.get_chat_template()
            except Exception:
                template = None
            prefix = extract_prefix(self.func, self.bind_arguments, template)
        return run_program_batch(self.func, be, batch, defaults, num_threads, progress_bar, prefix)

    def trace(self, *args: Any, backend: Any = None, **kwargs: Any) -> TraceResult:
        """Run the body with placeholders for the arguments not given; returns the recorded nodes and
        the constant prefix. A placeholder used in an f-string or str concatenation raises TypeError."""
        be = backend if backend is not None else get_default_backend()
        template = resolve_backend(be).get_chat_template() if be is not None else None
        return trace_program(self.func, args, {**self.bind_arguments, **kwargs}, template)

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)


def function(func: Callable | None = None, num_api_spec_tokens: int | None = None) -> Any:
    """Decorator making a program: `@function` or `@function()`."""
    if func is None:
        return lambda f: Function(f)
    return Function(func)
