"""The user-facing language: `@function`, `gen`, `gen_int`, `gen_string`, `select`, roles, backends.

Mirrors SGLang's `sglang/api.py` so `import radixgen as sgl` runs SGLang programs (LANG_API.md).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from radixgen.grammar.schema import DTYPE_REGEX
from radixgen.lang import ir
from radixgen.lang.backends.default import get_default_backend, resolve_backend, set_default_backend
from radixgen.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixgen.lang.global_config import global_config
from radixgen.lang.interpreter import ProgramState, run_program, run_program_batch
from radixgen.lang.reasoning import reasoning_tags
from radixgen.lang.tracer import TraceResult, extract_prefix, trace_program

__all__ = [
    "Function", "function", "gen", "gen_int", "gen_string", "select", "separate_reasoning", "system", "user",
    "assistant",
    "system_begin", "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end",
    "set_default_backend", "get_default_backend", "token_length_normalized", "greedy_token_selection",
    "unconditional_likelihood_normalized", "dtype_regex", "flush_cache", "get_server_info", "image", "video",
]

_DTYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str}


def dtype_regex(dtype: Any) -> str:
    """The regex a `gen(dtype=...)` is constrained to: int, float, bool or str (a quoted string)."""
    dtype = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in DTYPE_REGEX:
        raise ValueError(f"dtype must be int, float, bool or str, got {dtype!r}")
    return DTYPE_REGEX[dtype]


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
    name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None, n: int | None = None,
    stop: str | Sequence[str] | None = None, stop_token_ids: Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None, temperature: float | None = None, top_p: float | None = None,
    top_k: int | None = None, min_p: float | None = None, frequency_penalty: float | None = None,
    presence_penalty: float | None = None, ignore_eos: bool | None = None, return_logprob: bool | None = None,
    logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None, dtype: Any = None, choices: Sequence[str] | None = None,
    choices_method: Any = None, regex: str | None = None, json_schema: Any = None,
    token_healing: bool | None = None,
) -> ir.Expr:
    """Generate text into variable `name`; with `choices` it is a `select`. SGLang's parameters, in
    SGLang's order; `stop_regex` ends the text after the first match of a pattern."""
    if choices is not None:
        return select(name, choices, temperature=temperature or 0.0, choices_method=choices_method)
    if sum(x is not None for x in (regex, json_schema, dtype)) > 1:
        raise ValueError("give at most one of regex, json_schema and dtype")
    for pattern in [regex] + ([stop_regex] if isinstance(stop_regex, str) else list(stop_regex or [])):
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"invalid regex {pattern!r}: {e}") from None
    if dtype is not None:
        regex = dtype_regex(dtype)
    params = ir.SamplingParams.make(
        max_new_tokens=max_tokens, min_new_tokens=min_tokens, stop=stop, stop_token_ids=stop_token_ids,
        stop_regex=stop_regex, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, ignore_eos=ignore_eos,
        return_logprob=return_logprob, logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs, n=n, regex=regex,
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


# `run(...)` / `run_batch(...)` sampling defaults (SGLang's names and values); a gen's own arguments win.
RUN_DEFAULTS: dict[str, Any] = dict(
    max_new_tokens=128, min_new_tokens=None, n=1, stop=None, stop_token_ids=None, stop_regex=None,
    temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0,
    ignore_eos=False, return_logprob=False, logprob_start_len=None, top_logprobs_num=None,
    return_text_in_logprobs=None,
)


def _run_defaults(sampling: dict[str, Any]) -> ir.SamplingParams:
    return ir.SamplingParams.defaults().override(ir.SamplingParams.make(**{**RUN_DEFAULTS, **sampling}))


def _split_run_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(sampling defaults, program arguments) of `run(**kwargs)`."""
    sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in RUN_DEFAULTS}
    return sampling, kwargs


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

    def run(self, *args: Any, stream: bool = False, backend: Any = None, use_thread: bool = True,
            **kwargs: Any) -> ProgramState:
        """Run once; returns the ProgramState (at once when stream=True).

        Keyword arguments named in RUN_DEFAULTS (max_new_tokens, temperature, stop, ...) are the
        default sampling settings of every gen; the others are the program's own arguments.
        `use_thread` is SGLang's switch between an executor thread and the caller's thread; programs
        here always run on their executor thread, which gives the same result, so both values are accepted.
        """
        if not isinstance(use_thread, bool):
            raise TypeError(f"use_thread must be a bool, got {use_thread!r}")
        sampling, kwargs = _split_run_kwargs(dict(kwargs))
        defaults = _run_defaults(sampling)
        kwargs = {**self.bind_arguments, **kwargs}
        return run_program(self.func, resolve_backend(backend), args, kwargs, defaults, stream)

    def run_batch(self, batch_kwargs: Sequence[dict | Sequence], *, backend: Any = None,
                  num_threads: int | str = "auto", progress_bar: bool = False, generator_style: bool = False,
                  **sampling: Any) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per item (a dict of keyword or a tuple of positional arguments); input order kept.
        `generator_style=True` returns an iterator yielding the states in input order as they finish.

        The constant prefix found by tracing is prefilled once first (global_config's
        `enable_precache_with_tracing`), so every program reuses it."""
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of dicts (keyword arguments) or tuples (positional)")
        unknown = sorted(set(sampling) - set(RUN_DEFAULTS))
        if unknown:
            raise TypeError(f"run_batch() got unknown argument(s) {unknown}; sampling settings: {sorted(RUN_DEFAULTS)}")
        defaults = _run_defaults(sampling)
        be = resolve_backend(backend)
        batch = [{**self.bind_arguments, **a} if isinstance(a, dict) else a for a in batch_kwargs]
        prefix = None
        if len(batch) > 1 and global_config.enable_precache_with_tracing:
            try:
                template = be.get_chat_template()
            except Exception:
                template = None
            prefix = extract_prefix(self.func, self.bind_arguments, template)
        return run_program_batch(self.func, be, batch, defaults, num_threads, progress_bar, prefix, generator_style)

    def trace(self, *args: Any, backend: Any = None, **kwargs: Any) -> TraceResult:
        """Run the body with placeholders for the arguments not given; returns the recorded nodes and
        the constant prefix. A placeholder used in an f-string or str concatenation raises TypeError."""
        be = backend if backend is not None else get_default_backend()
        template = resolve_backend(be).get_chat_template() if be is not None else None
        return trace_program(self.func, args, {**self.bind_arguments, **kwargs}, template)

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)


def function(func: Callable | None = None, num_api_spec_tokens: int | None = None) -> Any:
    """Decorator making a program: `@function` or `@function()`.

    `num_api_spec_tokens` (SGLang's speculative execution for API-only models, which generates
    ahead and slices later gens out of one call) is refused with a clear error: radixgen's backends
    serve each gen from the prefix cache instead, and a silently ignored setting would change the
    number and cost of API calls a program expects."""
    if num_api_spec_tokens is not None:
        raise ValueError(
            f"@function(num_api_spec_tokens={num_api_spec_tokens!r}): speculative API calls are not "
            f"supported by radixgen; remove the argument (each gen is one call, and its prompt is served "
            f"from the prefix cache on sgl.Engine and sgl.RuntimeEndpoint)")
    if func is None:
        return lambda f: Function(f)
    return Function(func)


def flush_cache(backend: Any = None) -> None:
    """Empty the prefix cache of `backend` (default: the default backend)."""
    resolve_backend(backend).flush_cache()


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> ir.Expr:
    """`expr` (a named `gen` or `select`, or expressions holding some), then the split of each one's
    reasoning out of its value, as SGLang's frontend defines it: the variable keeps the answer, a
    variable `<name>_reasoning_content` gets the reasoning, and the reasoning leaves the program's text
    too. `model_type` names the reasoning format (`qwen3`, `qwen3-thinking`, `deepseek-r1`:
    lang/reasoning.py). Like SGLang, it does nothing in a streamed program (`stream=True`)."""
    reasoning_tags(model_type)
    if expr is None:
        return ir.ExprList([])
    leaves = ir.flatten(ir.to_expr(expr))
    targets = [e for e in leaves if isinstance(e, (ir.Gen, ir.Select))]
    for e in targets:
        if e.name is None:
            raise ValueError("separate_reasoning needs the gen or select to have a name: its reasoning is stored "
                             "under <name>_reasoning_content")
    return ir.ExprList([*leaves, *(ir.SeparateReasoning(model_type, e.name) for e in targets)])


def get_server_info(backend: Any = None) -> dict:
    """The configuration and live state of `backend`'s engine (default: the default backend)."""
    return resolve_backend(backend).get_server_info()


def image(expr: Any) -> ir.Expr:
    """SGLang's image input: refused, radixgen serves text-only models."""
    raise NotImplementedError("sgl.image: radixgen serves text-only models (Llama / SmolLM / Qwen); "
                              "images are not supported")


def video(path: str, num_frames: int) -> ir.Expr:
    """SGLang's video input: refused, radixgen serves text-only models."""
    raise NotImplementedError("sgl.video: radixgen serves text-only models; videos are not supported")
