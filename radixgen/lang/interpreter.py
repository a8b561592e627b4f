"""The interpreter: ProgramState (the `s` of a program), fork / join groups, run / run_batch, streaming.

A ProgramState is a thin handle over its StreamExecutor (executor.py), which runs the queued
expressions on its own thread; see that module for the execution and error model.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from radixgen.lang import ir
from radixgen.lang.backends.base import Backend
from radixgen.lang.executor import ProgramError, StreamExecutor, _Append, _Fail, _Gather, logger, start_body
from radixgen.lang.global_config import global_config

__all__ = ["ProgramError", "ProgramState", "ProgramStateGroup", "run_program", "run_program_batch"]


# meta_info lists with one entry per output token: a streamed chunk carries its own tokens' entries
_PER_TOKEN_META = ("output_token_logprobs", "output_top_logprobs")


def _chunk_meta(meta: dict, sent: int) -> tuple[dict, int]:
    """A gen's meta info so far (per-token lists from its first token) as one streamed chunk's, the
    way SGLang streams them: the per-token lists from entry `sent` on (the entries earlier chunks
    carried) and `output_token_logprobs_length`, the running count. Returns (chunk meta, new count)."""
    out = dict(meta)
    full = meta.get("output_token_logprobs")
    if full is None:  # the gen asked for no logprobs
        return out, sent
    # the engine's lists may have grown past the chunk they came with: cut them at its token count
    end = min(len(full), meta.get("completion_tokens", len(full)))
    for key in _PER_TOKEN_META:
        if meta.get(key) is not None:
            out[key] = list(meta[key][sent:end])
    out["output_token_logprobs_length"] = end
    return out, max(sent, end)


class ProgramState:
    """The `s` of a program: append with `+=`, read variables with `s["x"]`, fork, stream."""

    def __init__(self, executor: StreamExecutor) -> None:
        self._ex = executor

    # appending
    def __iadd__(self, other: Any) -> ProgramState:
        self._ex.submit(ir.to_expr(other))
        return self

    def _role(self, role: str, expr: Any = None):
        if expr is not None:
            self._ex.submit(ir.role_expr(role, expr))
            return None
        return self._role_block(role)

    @contextmanager
    def _role_block(self, role: str) -> Iterator[None]:
        self._ex.submit(ir.RoleBegin(role))
        yield
        self._ex.submit(ir.RoleEnd(role))

    def system(self, expr: Any = None):
        return self._role("system", expr)

    def user(self, expr: Any = None):
        return self._role("user", expr)

    def assistant(self, expr: Any = None):
        return self._role("assistant", expr)

    def system_begin(self) -> None:
        self._ex.submit(ir.RoleBegin("system"))

    def system_end(self) -> None:
        self._ex.submit(ir.RoleEnd("system"))

    def user_begin(self) -> None:
        self._ex.submit(ir.RoleBegin("user"))

    def user_end(self) -> None:
        self._ex.submit(ir.RoleEnd("user"))

    def assistant_begin(self) -> None:
        self._ex.submit(ir.RoleBegin("assistant"))

    def assistant_end(self) -> None:
        self._ex.submit(ir.RoleEnd("assistant"))

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        self._ex.submit(ir.VarScopeBegin(name))
        yield
        self._ex.submit(ir.VarScopeEnd(name))

    # reading
    def __getitem__(self, name: str) -> Any:
        return self._ex.get_var(name)

    def get_var(self, name: str) -> Any:
        return self._ex.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self._ex.set_var(name, value)

    set_var = __setitem__

    def __contains__(self, name: str) -> bool:
        try:
            self._ex.get_var(name)
            return True
        except (KeyError, ProgramError):
            return False

    def get_meta_info(self, name: str) -> dict:
        try:
            self._ex.get_var(name)
        except KeyError:
            pass
        return self._ex.meta_info.get(name, {})

    def text(self) -> str:
        self._ex.wait()
        return self._ex.text_

    def messages(self) -> list[dict]:
        self._ex.wait()
        return [dict(m) for m in self._ex.messages_]

    def trace(self) -> list[dict]:
        """One dict per gen/select (branches' calls included after join): name, kind, prompt_tokens,
        cached_tokens, completion_tokens, latency_s, branch (fork path)."""
        self._ex.wait()
        return [{k: v for k, v in r.items() if k not in ("text_start", "text_end", "executor")}
                for r in self._ex.records]

    def error(self) -> BaseException | None:
        self._ex.wait()
        return self._ex.error_

    def sync(self) -> ProgramState:
        self._ex.sync()
        return self

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"

    # fork / join
    def fork(self, size: int = 1, position_ids_offset: Any = None) -> ProgramStateGroup:
        """`size` branches sharing the text so far; its KV is computed once (prefilled here)."""
        if size < 1:
            raise ValueError(f"fork size must be >= 1, got {size}")
        return ProgramStateGroup([ProgramState(c) for c in self._ex.fork(size)], self)

    # streaming
    def text_iter(self, var_name: str | None = None, return_meta_data: bool = False) -> Iterator[Any]:
        """Yield text chunks as produced (all text, or only `var_name`'s); joined they equal the result.
        With `return_meta_data` (needs `var_name`) each item is `(chunk, meta_info)`, the meta info of
        that gen as of the chunk (token counts so far; the final one has its finish_reason). As in
        SGLang, a chunk's `output_token_logprobs` (and `output_top_logprobs`) hold that chunk's tokens
        only, and `output_token_logprobs_length` counts them all so far; `get_meta_info` has them all."""
        if return_meta_data and var_name is None:
            raise ValueError("return_meta_data=True needs a variable name: text_iter('answer', return_meta_data=True)")
        ex, prev, sent = self._ex, 0, 0
        while True:
            with ex.cond:
                while True:
                    meta: dict = {}
                    if var_name is None:
                        cur = ex.text_
                        done = ex.finished or ex.error_ is not None
                    else:
                        ev = ex.var_events.get(var_name)
                        ready = var_name in ex.variables and (ev is None or ev.is_set())
                        cur = ex.variables[var_name] if ready else ex.partial.get(var_name, "")
                        meta = ex.meta_info.get(var_name, {}) if ready else ex.partial_meta.get(var_name, {})
                        done = ready or ex.finished or ex.error_ is not None
                        if ready and not isinstance(cur, str):
                            cur = str(cur)
                    if len(cur) > prev or done:
                        break
                    ex.cond.wait(timeout=1.0)
            if len(cur) > prev:
                if return_meta_data:
                    chunk_meta, sent = _chunk_meta(meta, sent)
                    yield cur[prev:], chunk_meta
                else:
                    yield cur[prev:]
                prev = len(cur)
            if done:
                return

    async def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False
                              ) -> AsyncIterator[Any]:
        """asyncio twin of text_iter (the waiting happens in a worker thread)."""
        it, end = self.text_iter(var_name, return_meta_data), object()
        loop = asyncio.get_running_loop()
        while True:
            chunk = await loop.run_in_executor(None, next, it, end)
            if chunk is end:
                return
            yield chunk


class ProgramStateGroup:
    """The branches of `s.fork(n)`: index them, `+=` to all (a callable gets the branch index), join."""

    def __init__(self, states: list[ProgramState], src: ProgramState) -> None:
        self.states, self.src = states, src

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:  # `forks[i] += x` stores it back
        if value is not self.states[i]:
            raise TypeError("assign to fork branches only with `forks[i] += ...`")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> ProgramStateGroup:
        for i, s in enumerate(self.states):
            if callable(other) and not isinstance(other, ir.Expr):
                s += other(i)
            elif isinstance(other, (list, tuple)):
                s += other[i]
            else:
                s += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for all branches; gather their new variables as lists, or append their texts."""
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}")
        children = [s._ex for s in self.states]
        for c in children:
            c.wait()
        parent = self.src._ex
        records = []
        for c in children:
            for r in c.records:
                records.append({**r, "branch": [c.branch, *r["branch"]]})
        failed = next((c.error_ for c in children if c.error_ is not None), None)
        for c in children:
            c.end()
        if failed is not None:
            parent.submit_op(_Fail(failed))
            return
        if mode == "concate_and_append":
            parent.submit_op(_Append("".join(c.text_[c.fork_start:] for c in children), records))
            return
        names = list(dict.fromkeys(n for c in children for n in c.set_vars))
        values = {n: [c.variables.get(n) for c in children] for n in names}
        metas = {n: [c.meta_info.get(n) for c in children] for n in names}
        parent.submit_op(_Gather(values, metas, records), names)


def run_program(func: Callable, backend: Backend, args: Sequence, kwargs: dict,
                defaults: ir.SamplingParams, stream: bool) -> ProgramState:
    """Run one program; never raises for errors inside it (see state.error())."""
    ex = StreamExecutor(backend, defaults, stream)
    state = ProgramState(ex)

    def body() -> None:
        ex.body_thread = threading.get_ident()
        try:
            func(state, *args, **kwargs)
        except BaseException as e:  # noqa: B036 - recorded on the state
            if ex.error_ is None:
                logger.warning("program %s failed: %r", getattr(func, "__name__", func), e)
            ex.submit_op(_Fail(e))  # what was submitted before the error still runs
        finally:
            ex.end()
        if global_config.verbosity >= 2:
            print(state.text(), flush=True)

    if stream:
        start_body(body, name=f"radixgen-body-{ex.id}")  # waited for at interpreter exit
    else:
        body()
        ex.wait()
    return state


def run_program_batch(func: Callable, backend: Backend, batch: Sequence[dict | Sequence],
                      defaults: ir.SamplingParams, num_threads: int | str = "auto",
                      progress_bar: bool = False, prefix: str | None = None,
                      generator_style: bool = False) -> list[ProgramState] | Iterator[ProgramState]:
    """Run `func` once per argument set on a thread pool; states in input order (a list, or with
    `generator_style` an iterator yielding each state once it and those before it are done)."""
    if prefix and len(batch) > 1:
        backend.cache_prefix(prefix)
    if num_threads == "auto":
        num_threads = max(16, (os.cpu_count() or 1) * 16)
    num_threads = max(1, min(int(num_threads), len(batch) or 1))
    states = _batch_states(func, backend, batch, defaults, num_threads, progress_bar)
    return states if generator_style else list(states)


def _batch_states(func: Callable, backend: Backend, batch: Sequence[dict | Sequence], defaults: ir.SamplingParams,
                  num_threads: int, progress_bar: bool) -> Iterator[ProgramState]:
    from concurrent.futures import ThreadPoolExecutor

    def one(arg: dict | Sequence) -> ProgramState:
        if isinstance(arg, dict):
            return run_program(func, backend, (), arg, defaults, False)
        return run_program(func, backend, tuple(arg), {}, defaults, False)

    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(batch), desc=getattr(func, "__name__", "run_batch"))
    with ThreadPoolExecutor(num_threads, thread_name_prefix="radixgen-batch") as pool:
        futures = [pool.submit(one, a) for a in batch]
        if bar is not None:
            for f in futures:
                f.add_done_callback(lambda _f: bar.update(1))
        for f in futures:
            yield f.result()
    if bar is not None:
        bar.close()
