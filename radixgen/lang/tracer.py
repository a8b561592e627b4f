"""Tracing: run a program body with placeholder arguments and no model, recording its expressions.

The trace tells which text every run of the program starts with (the constant text, roles rendered
through the chat template, up to the first argument, gen or select). `run_batch` prefills that shared
prefix once before starting the batch, so all programs hit the prefix cache.

A placeholder cannot be turned into a str: an f-string (`f"Q: {question}"`), `str(question)` or
`"Q: " + question` raises TypeError saying so (append pieces instead: `s += "Q: "; s += question`).
`extract_prefix` tolerates that: the text recorded before the error is still a valid constant prefix.
Follows SGLang's sglang/lang/tracer.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from radixgen.lang import ir
from radixgen.lang.backends.base import ChatTemplate


def _placeholder_error(name: str, how: str) -> TypeError:
    return TypeError(
        f"argument {name!r} is a placeholder while the program is traced, so it cannot be used in {how}. "
        f"Append it on its own instead (s += {name}), or build the text with `+` of sgl expressions "
        f"outside f-strings; tracing is how run_batch finds the prompt prefix shared by all programs."
    )


class Placeholder(ir.Expr):
    """Stands for a program argument (or a variable read) while tracing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __format__(self, spec: str) -> str:
        raise _placeholder_error(self.name, "an f-string or str.format")

    def __str__(self) -> str:
        raise _placeholder_error(self.name, "str()")

    def __add__(self, other: Any) -> ir.ExprList:
        raise _placeholder_error(self.name, "a str concatenation")

    def __radd__(self, other: Any) -> ir.ExprList:
        raise _placeholder_error(self.name, "a str concatenation")

    def __iter__(self):
        raise _placeholder_error(self.name, "a loop or unpacking")

    def __getitem__(self, key: Any) -> Placeholder:
        return Placeholder(f"{self.name}[{key!r}]")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self.name}.{attr}")

    def __repr__(self) -> str:
        return f"Placeholder({self.name!r})"


@dataclass
class TraceResult:
    nodes: list[Any] = field(default_factory=list)  # ir leaves (and Placeholders) in submission order
    prefix: str = ""  # text every run starts with
    constant: bool = True  # still inside the constant prefix

    def add_text(self, text: str) -> None:
        if self.constant:
            self.prefix += text


class TracerState:
    """A ProgramState look-alike that records instead of executing."""

    def __init__(self, result: TraceResult, template: ChatTemplate | None) -> None:
        self.result, self.template = result, template
        self.num_turns = 0

    def __iadd__(self, other: Any) -> TracerState:
        leaves = [other] if isinstance(other, Placeholder) else ir.flatten(ir.to_expr(other))
        for e in leaves:
            self.result.nodes.append(e)
            if isinstance(e, ir.ConstantText):
                self.result.add_text(e.value)
            elif isinstance(e, (ir.RoleBegin, ir.RoleEnd)) and self.template is not None:
                if isinstance(e, ir.RoleBegin):
                    self.result.add_text(self.template.begin(e.role, first=self.num_turns == 0))
                else:
                    self.num_turns += 1
                    self.result.add_text(self.template.end(e.role))
            elif isinstance(e, (ir.VarScopeBegin, ir.VarScopeEnd)):
                pass
            else:  # gen, select, placeholder, or a role without a template
                self.result.constant = False
        return self

    def __getitem__(self, name: str) -> Placeholder:
        return Placeholder(f"s[{name!r}]")

    def __setitem__(self, name: str, value: Any) -> None:
        pass

    def __contains__(self, name: str) -> bool:
        return True

    def get_var(self, name: str) -> Placeholder:
        return self[name]

    def get_meta_info(self, name: str) -> dict:
        return {}

    def _role(self, role: str, expr: Any = None):
        if expr is not None:
            self += ir.role_expr(role, expr)
            return None
        return self._role_block(role)

    @contextmanager
    def _role_block(self, role: str) -> Iterator[None]:
        self += ir.RoleBegin(role)
        yield
        self += ir.RoleEnd(role)

    def system(self, expr: Any = None):
        return self._role("system", expr)

    def user(self, expr: Any = None):
        return self._role("user", expr)

    def assistant(self, expr: Any = None):
        return self._role("assistant", expr)

    def __getattr__(self, attr: str) -> Callable:
        for role in ir.ROLES:
            if attr == f"{role}_begin":
                return lambda r=role: self.__iadd__(ir.RoleBegin(r))
            if attr == f"{role}_end":
                return lambda r=role: self.__iadd__(ir.RoleEnd(r))
        raise AttributeError(attr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        yield

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> _TracerGroup:
        self.result.constant = False  # after a fork the branches diverge
        return _TracerGroup([TracerState(self.result, self.template) for _ in range(size)])

    def text(self) -> Placeholder:
        return Placeholder("s.text()")

    def messages(self) -> list[dict]:
        return []

    def sync(self) -> TracerState:
        return self

    def error(self) -> None:
        return None


class _TracerGroup(list):
    def __iadd__(self, other: Any) -> _TracerGroup:
        for i, s in enumerate(self):
            s += other(i) if callable(other) and not isinstance(other, ir.Expr) else other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        pass


def trace_program(func: Callable, args: tuple, kwargs: dict, template: ChatTemplate | None) -> TraceResult:
    """Run `func` with placeholders for the parameters not given; errors propagate."""
    params = list(inspect.signature(func).parameters.values())[1:]
    bound = dict(kwargs)
    for p, a in zip(params, args, strict=False):
        bound[p.name] = a
    for p in params:
        if p.name not in bound and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            bound[p.name] = Placeholder(p.name)
    result = TraceResult()
    func(TracerState(result, template), **bound)
    return result


def extract_prefix(func: Callable, kwargs: dict, template: ChatTemplate | None) -> str:
    """The constant text every run of `func` starts with ("" when tracing fails before any)."""
    params = list(inspect.signature(func).parameters.values())[1:]
    bound = {k: v for k, v in kwargs.items() if k in {p.name for p in params}}
    result = TraceResult()
    try:
        for p in params:
            if p.name not in bound and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                bound[p.name] = Placeholder(p.name)
        func(TracerState(result, template), **bound)
    except Exception:  # a placeholder used as a str, or Python logic on it: keep what was recorded
        pass
    return result.prefix
