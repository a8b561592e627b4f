"""Expression nodes of the program language: what `s += ...` hands to the interpreter.

A program appends expressions to its state: constant text, `Gen` / `Select` calls, role and
variable-scope markers. `+` between expressions (or an expression and a str) builds an `ExprList`,
so `s += "Q: " + sgl.gen("a")` is one submission. The nodes are plain data; the interpreter
(interpreter.py) executes them and the tracer (tracer.py) walks them without a model.
Mirrors the node set of SGLang's frontend (`sglang/lang/ir.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from radixgen.grammar.schema import DTYPE_REGEX

# Program-level defaults, the same as SGLang's `run()` defaults.
DEFAULT_MAX_NEW_TOKENS = 128

# SGLang's names for the patterns behind `gen(dtype=...)` (radixgen's own, stricter patterns:
# grammar/schema.py). `sgl.gen(regex=REGEX_INT)` is the same as `sgl.gen(dtype=int)`.
REGEX_INT = DTYPE_REGEX[int]
REGEX_FLOAT = DTYPE_REGEX[float]
REGEX_BOOL = DTYPE_REGEX[bool]
REGEX_STR = DTYPE_REGEX[str]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one `gen`; None means "not set here" (a lower layer decides).

    Layers merge with `override`: a gen's own arguments win over `run(...)` defaults, which win
    over `SamplingParams.defaults()`.
    """

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    stop_regex: tuple[str, ...] | None = None  # applied by the backend while streaming (common/stop_regex.py)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None
    logprob_start_len: int | None = None  # prompt logprobs from this position (return_logprob)
    return_text_in_logprobs: bool | None = None  # logprob entries (logprob, id, text) instead of (logprob, id)
    skip_special_tokens: bool | None = None  # set from global_config by the executor
    n: int | None = None
    regex: str | None = None
    json_schema: str | None = None  # always a JSON string here (api.py converts dicts / pydantic)
    token_healing: bool | None = None

    @classmethod
    def defaults(cls) -> SamplingParams:
        return cls(max_new_tokens=DEFAULT_MAX_NEW_TOKENS, min_new_tokens=0, stop=(), stop_token_ids=(),
                   temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, frequency_penalty=0.0,
                   presence_penalty=0.0, ignore_eos=False, return_logprob=False, top_logprobs_num=0, n=1)

    @classmethod
    def make(cls, **kw: Any) -> SamplingParams:
        """Build from user arguments: str stop -> tuple, lists -> tuples, unknown names rejected."""
        names = {f.name for f in fields(cls)}
        bad = sorted(set(kw) - names)
        if bad:
            raise TypeError(f"unknown sampling argument(s) {bad}; known: {sorted(names)}")
        for k in ("stop", "stop_regex"):
            if isinstance(kw.get(k), str):
                kw[k] = (kw[k],)
        for k in ("stop", "stop_token_ids", "stop_regex"):
            if kw.get(k) is not None:
                kw[k] = tuple(kw[k])
        return cls(**kw)

    def override(self, other: SamplingParams | None) -> SamplingParams:
        """Fields set (non-None) in `other` replace ours."""
        if other is None:
            return self
        return replace(self, **{f.name: v for f in fields(other) if (v := getattr(other, f.name)) is not None})

    @property
    def is_constrained(self) -> bool:
        return self.regex is not None or self.json_schema is not None

    def to_engine(self) -> dict[str, Any]:
        """The SGLang-named sampling_params dict of the runtime (None fields left out)."""
        keys = ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
                "frequency_penalty", "presence_penalty", "ignore_eos", "n", "regex", "json_schema",
                "skip_special_tokens")
        out = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if self.stop:
            out["stop"] = list(self.stop)
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        return out


class Expr:
    """Base of all nodes; `a + b` concatenates into an ExprList."""

    def __add__(self, other: Any) -> ExprList:
        return ExprList([*flatten(self), *flatten(to_expr(other))])

    def __radd__(self, other: Any) -> ExprList:
        return ExprList([*flatten(to_expr(other)), *flatten(self)])


@dataclass(eq=False)
class ConstantText(Expr):
    value: str


@dataclass(eq=False)
class Gen(Expr):
    """Generate text and store it under `name` (an auto name when None)."""

    name: str | None
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass(eq=False)
class Select(Expr):
    """Pick one of `choices` by scoring each as a continuation; store it under `name`."""

    name: str | None
    choices: list[str]
    temperature: float = 0.0
    choices_method: Any = None  # a choices.py method; None -> token_length_normalized


@dataclass(eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(eq=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(eq=False)
class ExprList(Expr):
    exprs: list[Expr]


@dataclass(eq=False)
class SeparateReasoning(Expr):
    """Split the reasoning out of the finished variable `target` (lang/reasoning.py): `target` keeps the
    answer, `name` (`<target>_reasoning_content`) gets the reasoning."""

    model_type: str
    target: str

    @property
    def name(self) -> str:
        return f"{self.target}_reasoning_content"


ROLES = ("system", "user", "assistant")


def to_expr(x: Any) -> Expr:
    """str -> ConstantText; expressions pass; anything else is a clear TypeError."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return ConstantText(x)
    hook = getattr(x, "__radixgen_expr__", None)  # tracer placeholders raise their own message here
    if hook is not None:
        return hook()
    raise TypeError(
        f"cannot append a {type(x).__name__} to a program: use a str, sgl.gen(...), sgl.select(...), "
        f"a role such as sgl.user(...), or a `+` of those (convert numbers with str())"
    )


def flatten(expr: Expr) -> list[Expr]:
    """The leaf nodes of an expression, in order (ExprLists dissolved)."""
    if isinstance(expr, ExprList):
        return [leaf for e in expr.exprs for leaf in flatten(e)]
    return [expr]


def role_expr(role: str, expr: Any = None) -> ExprList:
    """RoleBegin + expr + RoleEnd (expr None: an empty turn)."""
    body = [] if expr is None else flatten(to_expr(expr))
    return ExprList([RoleBegin(role), *body, RoleEnd(role)])
