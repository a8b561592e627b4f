"""Command-line flags generated from config dataclasses (EngineConfig, RouterConfig, ...): the field
name with dashes, the type and choices from the annotation, the help from the docstring under the
field, so a flag and a field never drift. A bool field defaulting to False is a switch; one
defaulting to True gets a --no- form."""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
import typing
from dataclasses import MISSING, fields
from typing import Any

from radixgen.runtime.config import EngineConfig


def field_docs(cls: type) -> dict[str, str]:
    """The docstring literal under each annotated field of a dataclass (PEP 257 attribute docstrings)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(type without None, whether None is allowed)."""
    args = typing.get_args(tp)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else rest), True
    return tp, False


def add_engine_flags(parser: argparse.ArgumentParser, aliases: dict[str, list[str]] | None = None) -> None:
    """One flag per EngineConfig field."""
    add_config_flags(parser, EngineConfig, "engine options (EngineConfig fields)", aliases)


def add_config_flags(parser: argparse.ArgumentParser, cls: type, title: str,
                     aliases: dict[str, list[str]] | None = None) -> None:
    """One flag per field of the config dataclass `cls`, in an argument group titled `title`."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    group = parser.add_argument_group(title)
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        names = [flag, *(aliases or {}).get(f.name, [])]
        default = f.default if f.default is not MISSING else None
        help_ = docs.get(f.name, "")
        tp, optional = _base_type(hints[f.name])
        if tp is bool:
            if default:
                group.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=True, help=help_)
            else:
                group.add_argument(*names, dest=f.name, action="store_true", help=help_)
            continue
        kw: dict[str, Any] = {"dest": f.name, "default": default}
        if typing.get_origin(tp) is typing.Literal:
            kw["choices"] = list(typing.get_args(tp))
            kw["type"] = type(kw["choices"][0])
        elif tp in (int, float, str):
            kw["type"] = tp
        suffix = f" (default: {default})" if default is not None else ""
        group.add_argument(*names, help=help_ + suffix, metavar=f.name.upper() if "choices" not in kw else None,
                           **kw)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return config_kwargs(args, EngineConfig)


def config_kwargs(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in fields(cls)}
