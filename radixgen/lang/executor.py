"""The executor: runs one program's (or one fork branch's) expressions in order on its own thread.

`s += expr` only queues `expr` on the program's executor thread and returns, so a program body runs
ahead of the model until it reads a variable (`s["x"]` waits for it). That is what lets
`forks += lambda i: gen(...)` put all branches in flight at once and `run(stream=True)` return
immediately. Follows the design of SGLang's `StreamExecutor` (sglang/lang/interpreter.py).

Once the body has returned and the queue is drained, the executor thread exits; what is submitted
to the finished state afterwards (`state.fork(3)` after `run()`, a join's gather, `s += ...`) runs at
once on the caller's thread, so such calls never wait on a thread that is gone.

Errors: an exception in a model call, or in the body (after what the body submitted before it has
run), is recorded on the state (`state.error()`); the executor then skips the rest of the program,
wakes every waiter, and `s["x"]` of a variable that never got a value raises `ProgramError` instead
of hanging; `state.sync()` re-raises.

Exit: executor threads are daemons (a forgotten fork must not keep the process alive), so at
interpreter exit `drain_at_exit` lets streaming bodies return, ends every executor and waits for its
queue to drain, while the engines still serve them (radixgen/common/exit_hooks.py says why a thread
must not be inside the model when Python finalizes). Programs still running at exit finish, as
SGLang's non-daemon program threads do.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from radixgen.common.exit_hooks import PROGRAMS, at_exit
from radixgen.lang import ir
from radixgen.lang.backends.base import Backend, ChatTemplate, Context
from radixgen.lang.choices import token_length_normalized
from radixgen.lang.global_config import global_config
from radixgen.lang.reasoning import reasoning_tags, split_reasoning

logger = logging.getLogger("radixgen.lang")


class ProgramError(RuntimeError):
    """A variable or result of a program that failed; `__cause__` is the original error."""


# Internal operations queued next to the user's expressions.
@dataclass(eq=False)
class _CommitPrefix:  # prefill the text so far (before a fork) so the branches share it
    pass


@dataclass(eq=False)
class _Gather:  # join(mode="gather_variable")
    values: dict[str, list]
    metas: dict[str, list]
    records: list[dict]


@dataclass(eq=False)
class _Append:  # join(mode="concate_and_append")
    text: str
    records: list[dict]


@dataclass(eq=False)
class _Fail:  # a branch failed: fail the parent at this point
    error: BaseException


_END = object()
_live: weakref.WeakSet[StreamExecutor] = weakref.WeakSet()  # executors whose thread may still run
_bodies: set[threading.Thread] = set()  # streaming programs' body threads still running


def start_body(body: Callable[[], None], name: str) -> None:
    """Run a streaming program's `body` on a daemon thread that `drain_at_exit` waits for."""
    def run() -> None:
        try:
            body()
        finally:
            _bodies.discard(thread)

    thread = threading.Thread(target=run, name=name, daemon=True)
    _bodies.add(thread)
    thread.start()


def drain_at_exit() -> None:
    """At interpreter exit: wait for streaming bodies to return, end every executor whose body is
    done (fork branches never joined included) and join the executors' threads; again for executors
    that appeared meanwhile."""
    seen: set[StreamExecutor] = set()
    while True:
        for thread in list(_bodies):
            thread.join()
        executors = [ex for ex in list(_live) if ex not in seen]
        if not executors:
            return
        seen.update(executors)
        for ex in executors:
            if ex.parent is not None or ex.body_done.is_set():  # a body still running elsewhere ends it
                ex.end()
        for ex in executors:
            if ex.body_done.is_set() and ex.thread is not threading.current_thread():
                ex.thread.join()


at_exit(drain_at_exit, PROGRAMS)


class StreamExecutor:
    """Executes one program's (or one fork branch's) expressions in order on its own thread."""

    def __init__(self, backend: Backend, defaults: ir.SamplingParams, stream: bool = False,
                 parent: StreamExecutor | None = None, branch: int | None = None) -> None:
        self.backend, self.defaults, self.stream = backend, defaults, stream
        self.id = uuid.uuid4().hex[:8]
        self.parent, self.branch = parent, branch
        self.cond = threading.Condition()  # guards text / variables / events / error
        self.text_ = ""
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, dict] = {}
        self.var_events: dict[str, threading.Event] = {}
        self.partial: dict[str, str] = {}  # streaming values in progress
        self.partial_meta: dict[str, dict] = {}  # meta info of the latest chunk of a streaming value
        self.set_vars: list[str] = []  # names set by this executor (gathered at join)
        self.messages_: list[dict] = []
        self.role: str | None = None
        self.role_start = 0
        self.num_turns = 0
        self.scopes: dict[str, int] = {}
        self.records: list[dict] = []  # one per gen/select (state.trace())
        self.fork_groups: list[tuple[int, list[StreamExecutor]]] = []  # (text pos, branches), for viz
        self.fork_start = 0
        self.error_: BaseException | None = None
        self.finished = False
        self.submitted_role: str | None = None  # role open as seen by the submitting thread
        self.auto_names = 0
        self._template: ChatTemplate | None = None
        self.queue: queue.Queue = queue.Queue()
        self.inline_lock = threading.Lock()  # serializes what runs on callers' threads once finished
        self.body_done = threading.Event()
        self.body_thread: int | None = None
        self.thread = threading.Thread(target=self._worker, name=f"radixgen-program-{self.id}", daemon=True)
        self.thread.start()
        _live.add(self)

    # ---- submitting side (program body thread) ----
    def submit(self, expr: ir.Expr) -> None:
        leaves = ir.flatten(expr)
        with self.cond:
            if self.error_ is not None:
                raise ProgramError(f"program already failed: {self.error_!r}") from self.error_
            for e in leaves:
                if isinstance(e, ir.RoleBegin):
                    if self.submitted_role is not None:
                        raise ValueError(f"nested roles: {e.role!r} begins inside the open {self.submitted_role!r}"
                                         f" role; end it first")
                    self.submitted_role = e.role
                elif isinstance(e, ir.RoleEnd):
                    if self.submitted_role != e.role:
                        raise ValueError(f"{e.role}_end() without a matching {e.role}_begin() "
                                         f"(open role: {self.submitted_role!r})")
                    self.submitted_role = None
                elif isinstance(e, (ir.Gen, ir.Select)):
                    if e.name is None:
                        self.auto_names += 1
                        e.name = f"_gen_{self.auto_names}"
                    self.var_events[e.name] = threading.Event()
                elif isinstance(e, (ir.VarScopeEnd, ir.SeparateReasoning)):
                    self.var_events[e.name] = threading.Event()
            ended = self.body_done.is_set()
            if not ended:
                for e in leaves:
                    self.queue.put(e)
            self.cond.notify_all()
        if ended:
            self._run_inline(leaves)

    def submit_op(self, op: Any, names: Sequence[str] = ()) -> None:
        with self.cond:
            for n in names:
                self.var_events[n] = threading.Event()
            ended = self.body_done.is_set()
            if not ended:
                self.queue.put(op)
        if ended:
            self._run_inline([op])

    def _run_inline(self, items: Sequence[Any]) -> None:
        """Run `items` on this thread: the executor has ended (its thread drains what came before)."""
        if threading.current_thread() is not self.thread:
            self.thread.join()
        with self.inline_lock:
            for item in items:
                self._execute_or_skip(item)

    def _execute_or_skip(self, item: Any) -> None:
        """Execute `item`; after a failure, skip it and wake whoever waits on its variables."""
        try:
            if self.error_ is None:
                self._execute(item)
            else:
                self.record_error(self.error_)
        except BaseException as e:  # noqa: B036 - recorded and re-raised by sync()
            self.record_error(e)

    def end(self) -> None:
        """No more submissions: the thread exits once the queue is drained; branches end too."""
        if self.body_done.is_set():
            return
        with self.cond:
            self.body_done.set()
            self.cond.notify_all()
        self.queue.put(_END)
        for _, group in self.fork_groups:
            for child in group:
                if not child.body_done.is_set():
                    child.end()

    def record_error(self, err: BaseException) -> None:
        with self.cond:
            if self.error_ is None:
                self.error_ = err
            for ev in self.var_events.values():
                ev.set()
            self.cond.notify_all()

    def _outside_body(self) -> bool:
        """True when called from another thread than a still-running program body."""
        return self.parent is None and threading.get_ident() != self.body_thread

    def wait(self) -> None:
        """Wait until everything submitted so far has run; seen from outside a running (streaming)
        program, until its body has returned too. A fork branch has no body: its queue drains."""
        if self._outside_body():
            self.body_done.wait()
        self.queue.join()
        with self.inline_lock:  # whatever runs on another caller's thread
            pass

    def sync(self) -> None:
        self.wait()
        if self.error_ is not None:
            raise ProgramError(f"program failed: {self.error_!r}") from self.error_

    def get_var(self, name: str) -> Any:
        with self.cond:
            # Seen from outside a running body, a variable may simply not be submitted yet.
            while (name not in self.var_events and name not in self.variables and self.error_ is None
                   and not self.body_done.is_set() and self._outside_body()):
                self.cond.wait(timeout=0.5)
            ev = self.var_events.get(name)
        if ev is not None:
            ev.wait()
        elif name not in self.variables:
            self.queue.join()  # a failure queued by the body may still be landing
        with self.cond:
            if name in self.variables:
                return self.variables[name]
            if self.error_ is not None:
                raise ProgramError(f"variable {name!r} is missing: the program failed with "
                                   f"{self.error_!r}") from self.error_
        raise KeyError(f"no variable {name!r} in this program (known: {sorted(self.variables)})")

    def set_var(self, name: str, value: Any) -> None:
        with self.cond:
            self.variables[name] = value
            self.set_vars.append(name)

    def fork(self, size: int) -> list[StreamExecutor]:
        if size > 1:  # (the text so far may still be in the queue: the op checks it)
            self.submit_op(_CommitPrefix())
        self.sync()
        children = []
        for i in range(size):
            c = StreamExecutor(self.backend, self.defaults, self.stream, parent=self, branch=i)
            c.text_, c.fork_start = self.text_, len(self.text_)
            c.variables, c.meta_info = dict(self.variables), dict(self.meta_info)
            c.messages_ = [dict(m) for m in self.messages_]
            c.role, c.role_start, c.num_turns = self.role, self.role_start, self.num_turns
            c.submitted_role, c.scopes, c._template = self.submitted_role, dict(self.scopes), self._template
            c.auto_names = self.auto_names
            children.append(c)
        self.fork_groups.append((len(self.text_), children))
        return children

    # ---- executing side (worker thread) ----
    def _worker(self) -> None:
        while True:
            expr = self.queue.get()
            try:
                if expr is _END:
                    return
                self._execute_or_skip(expr)
            finally:
                if expr is _END:
                    with self.cond:
                        self.finished = True
                        self.cond.notify_all()
                self.queue.task_done()

    @property
    def template(self) -> ChatTemplate:
        if self._template is None:
            self._template = self.backend.get_chat_template()
        return self._template

    def _append(self, s: str, var: str | None = None) -> None:
        with self.cond:
            self.text_ += s
            if var is not None:
                self.partial[var] = self.partial.get(var, "") + s
            self.cond.notify_all()

    def _set(self, name: str, value: Any, meta: dict | None) -> None:
        with self.cond:
            self.variables[name] = value
            if meta is not None:
                self.meta_info[name] = meta
            self.set_vars.append(name)
            self.partial.pop(name, None)
            self.partial_meta.pop(name, None)
            ev = self.var_events.get(name)
            if ev is not None:
                ev.set()
            self.cond.notify_all()

    def _ctx(self) -> Context:
        role_text = self.text_[self.role_start:] if self.role else ""
        return Context(self.text_, [dict(m) for m in self.messages_], self.role, role_text)

    def _execute(self, e: Any) -> None:
        if isinstance(e, ir.ConstantText):
            self._append(e.value)
        elif isinstance(e, ir.Gen):
            self._gen(e)
        elif isinstance(e, ir.Select):
            self._select(e)
        elif isinstance(e, ir.RoleBegin):
            self._append(self.template.begin(e.role, first=self.num_turns == 0))
            self.role, self.role_start = e.role, len(self.text_)
        elif isinstance(e, ir.RoleEnd):
            self.messages_.append({"role": e.role, "content": self.text_[self.role_start:]})
            self.role, self.num_turns = None, self.num_turns + 1
            self._append(self.template.end(e.role))
        elif isinstance(e, ir.VarScopeBegin):
            self.scopes[e.name] = len(self.text_)
        elif isinstance(e, ir.VarScopeEnd):
            self._set(e.name, self.text_[self.scopes.pop(e.name):], None)
        elif isinstance(e, ir.SeparateReasoning):
            self._separate_reasoning(e)
        elif isinstance(e, _CommitPrefix):
            if self.text_:
                self.backend.cache_prefix(self.text_)
        elif isinstance(e, _Gather):
            for n, vals in e.values.items():
                self._set(n, vals, {"branches": e.metas[n]})
            self.records.extend(e.records)
        elif isinstance(e, _Append):
            self._append(e.text)
            self.records.extend(e.records)
        elif isinstance(e, _Fail):
            raise e.error
        else:
            raise TypeError(f"unknown expression {e!r}")

    def _gen(self, e: ir.Gen) -> None:
        params = self.defaults.override(e.params)
        if params.skip_special_tokens is None:
            params = replace(params, skip_special_tokens=global_config.skip_special_tokens_in_output)
        stop_str = self.template.stop_str if self.role == "assistant" else None
        if stop_str and stop_str not in (params.stop or ()):
            params = replace(params, stop=(*(params.stop or ()), stop_str))
        ctx, start, t0 = self._ctx(), len(self.text_), time.perf_counter()
        if self.stream and (params.n or 1) == 1:
            meta: dict = {}
            value = ""
            for delta, m in self.backend.generate_stream(ctx, params):
                if m is not None:
                    meta = m
                    with self.cond:
                        self.partial_meta[e.name] = m
                if delta:
                    value += delta
                    self._append(delta, var=e.name)
        else:
            value, meta = self.backend.generate(ctx, params)
            self._append(value if isinstance(value, str) else value[0])
        self._record("gen", e.name, meta, t0, start)
        self._set(e.name, value, meta)

    def _separate_reasoning(self, e: ir.SeparateReasoning) -> None:
        """The target keeps its answer, `e.name` gets the reasoning, and the text keeps only the answer
        where the value ends it (right after its gen). Skipped when streaming, as SGLang does (the
        reasoning variable is then missing: reading it raises KeyError instead of waiting forever)."""
        if self.stream:
            with self.cond:
                self.var_events[e.name].set()
            return
        value = self.variables[e.target]
        if not isinstance(value, str):
            raise ValueError(f"separate_reasoning: {e.target!r} holds {type(value).__name__}, not one text "
                             "(a gen with n > 1?)")
        reasoning, answer = split_reasoning(value, reasoning_tags(e.model_type))
        with self.cond:
            if value and self.text_.endswith(value):
                self.text_ = self.text_[: len(self.text_) - len(value)] + answer
        self._set(e.target, answer, self.meta_info.get(e.target))
        self._set(e.name, reasoning, None)

    def _select(self, e: ir.Select) -> None:
        ctx, start, t0 = self._ctx(), len(self.text_), time.perf_counter()
        method = e.choices_method or token_length_normalized
        decision = self.backend.select(ctx, list(e.choices), e.temperature, method)
        self._append(decision.decision)
        self._record("select", e.name, decision.meta_info, t0, start)
        self._set(e.name, decision.decision, decision.meta_info)

    def _record(self, kind: str, name: str, meta: dict, t0: float, start: int) -> None:
        self.records.append({
            "name": name, "kind": kind, "prompt_tokens": meta.get("prompt_tokens", 0),
            "cached_tokens": meta.get("cached_tokens", 0), "completion_tokens": meta.get("completion_tokens", 0),
            "latency_s": time.perf_counter() - t0, "branch": [], "text_start": start, "text_end": len(self.text_),
            "executor": self.id})
