"""The part of /v1/chat/completions and /v1/completions that is the same: run a request's choices on
the engine and answer, streamed or not, through one code path.

An endpoint describes its request as a `Plan` (one engine sequence per choice) and its output as an
`Output`, which turns each engine chunk of a choice into choice deltas. Streaming sends every delta
as an SSE chunk as the engine produces it (`data: [DONE]` last, a usage chunk first when asked).
Without streaming the engine returns each choice whole, the same `Output` turns that single chunk
into deltas, and `Output.response` folds them into the answer. The output parsers give the same
events for any split of the text, so both ways answer alike.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from radixgen.runtime.server.protocol import APIError, Usage
from radixgen.runtime.server.state import ServerState, abort_error
from radixgen.runtime.server.streams import SSE_DONE, SSEResponse, merge_streams, sse


@dataclass
class Seq:
    """One choice's engine work."""

    input_ids: list[int]
    sampling_params: dict[str, Any]
    prompt: int  # which of the request's prompts it continues


@dataclass
class Plan:
    """A request's choices (prompt-major: choice `p * n + k` is the k-th of prompt p) and options."""

    seqs: list[Seq]
    options: dict[str, Any]  # engine arguments every sequence shares (logprob options)
    constraint_param: str | None  # the request field a grammar error is blamed on
    stream: bool
    include_usage: bool = False


def expand(prompts: list[list[int]], sampling_params: dict[str, Any], n: int) -> list[Seq]:
    """n sequences per prompt; with a seed, choice k of a prompt samples with seed + k."""
    seed = sampling_params.get("seed")
    return [Seq(ids, dict(sampling_params, seed=seed + k) if n > 1 and seed is not None else sampling_params, p)
            for p, ids in enumerate(prompts) for k in range(n)]


@dataclass
class TokenLogprobs:
    """Logprobs of a chunk's new tokens: (logprob, token id) each, and the top (logprob, id) lists."""

    entries: list
    tops: list | None


class Output(ABC):
    """What an endpoint makes of its choices' engine chunks."""

    def opening(self, index: int) -> list[Any]:
        """Deltas sent for a choice before any output (chat: the assistant role)."""
        return []

    @abstractmethod
    def step(self, index: int, chunk: dict, logprobs: TokenLogprobs | None) -> list[Any]:
        """The deltas of one engine chunk of choice `index` (the last one carries the finish reason)."""

    @abstractmethod
    def chunk(self, deltas: list[Any], usage: Usage | None = None) -> Any:
        """A streamed chunk object holding these choice deltas (or only the usage)."""

    @abstractmethod
    def response(self, deltas: list[list[Any]], metas: list[dict], usage: Usage) -> Any:
        """The non-streamed answer: every choice's deltas folded (`metas`: each one's final meta_info)."""


@dataclass
class Progress:
    """Per-choice bookkeeping: tokens seen (to slice logprobs) and the final meta_info."""

    plan: Plan
    seen: list[int] = field(init=False)
    metas: list[dict | None] = field(init=False)

    def __post_init__(self) -> None:
        self.seen = [0] * len(self.plan.seqs)
        self.metas = [None] * len(self.plan.seqs)

    def take(self, index: int, chunk: dict) -> TokenLogprobs | None:
        """Record chunk `chunk` of choice `index`; return its new tokens' logprobs if asked for."""
        meta = chunk["meta_info"]
        start, new = self.seen[index], len(chunk["output_ids"])
        self.seen[index] += new
        if meta["finish_reason"] is not None:
            self.metas[index] = meta
        if not self.plan.options.get("return_logprob"):
            return None
        tops = meta.get("output_top_logprobs")
        return TokenLogprobs(meta["output_token_logprobs"][start:start + new],
                             tops[start:start + new] if tops is not None else None)

    @property
    def done(self) -> bool:
        return all(m is not None for m in self.metas)

    def usage(self) -> Usage:
        """Each prompt counted once; its cached tokens are the fewest any of its choices reused."""
        prompt: dict[int, int] = {}
        cached: dict[int, int] = {}
        for seq, meta in zip(self.plan.seqs, self.metas, strict=True):
            assert meta is not None
            prompt[seq.prompt] = meta["prompt_tokens"]
            cached[seq.prompt] = min(cached.get(seq.prompt, meta["cached_tokens"]), meta["cached_tokens"])
        completion = sum(m["completion_tokens"] for m in self.metas if m is not None)
        return Usage.of(sum(prompt.values()), completion, sum(cached.values()))


async def respond(state: ServerState, request: Request, plan: Plan, out: Output) -> Response:
    """Run `plan` on the engine and answer with `out`, as SSE when `plan.stream`, else as JSON."""
    if plan.stream:
        items = await open_deltas(state, request, plan, out)
        return SSEResponse(_sse(out, items))
    deltas, metas, usage = await run(state, request, plan, out)
    return JSONResponse(out.response(deltas, metas, usage).model_dump(exclude_none=True))


async def run(state: ServerState, request: Request | None, plan: Plan, out: Output
              ) -> tuple[list[list[Any]], list[dict], Usage]:
    """Run `plan` without streaming: every choice's deltas (opening first), its final meta_info, and
    the usage. `request` None: work no client waits on (it is not cancelled by a disconnect)."""
    result = await state.generate(request, plan.constraint_param, input_ids=[s.input_ids for s in plan.seqs],
                                  sampling_params=[s.sampling_params for s in plan.seqs], **plan.options)
    progress = Progress(plan)
    deltas = [[*out.opening(i), *out.step(i, chunk, progress.take(i, chunk))] for i, chunk in enumerate(result)]
    return deltas, [c["meta_info"] for c in result], progress.usage()


Streamed = list[Any] | Usage | APIError  # what a streamed run yields


async def open_deltas(state: ServerState, request: Request | None, plan: Plan, out: Output
                      ) -> AsyncIterator[Streamed]:
    """Start `plan`'s streams (input errors raise here, before anything is sent) and return an iterator
    of: the choices' opening deltas, then each engine chunk's deltas as they come, then the usage if
    `plan.include_usage`; or, where the engine aborts a choice midway, its APIError last."""
    for ids, count in Counter(tuple(s.input_ids) for s in plan.seqs).items():
        if count > 1:
            await state.precache(list(ids))  # the choices of one prompt share its KV
    streams = await state.open_streams(
        request, [dict(plan.options, input_ids=s.input_ids, sampling_params=s.sampling_params) for s in plan.seqs],
        plan.constraint_param)
    return _deltas(plan, out, streams)


async def _deltas(plan: Plan, out: Output, streams: list[tuple[dict, AsyncIterator[dict]]]
                  ) -> AsyncIterator[Streamed]:
    progress = Progress(plan)
    opening = [d for i in range(len(plan.seqs)) for d in out.opening(i)]
    if opening:
        yield opening
    async with contextlib.aclosing(merge_streams(streams)) as merged:
        async for i, chunk in merged:
            fr = chunk["meta_info"]["finish_reason"]
            if fr is not None and fr["type"] == "abort":
                yield abort_error(fr)
                return
            deltas = out.step(i, chunk, progress.take(i, chunk))
            if deltas:
                yield deltas
    if plan.include_usage and progress.done:
        yield progress.usage()


async def _sse(out: Output, items: AsyncIterator[Streamed]) -> AsyncIterator[bytes]:
    """Chat / completions SSE: one write per engine chunk, `data: [DONE]` last."""
    async with contextlib.aclosing(items):
        async for item in items:
            if isinstance(item, APIError):
                yield sse(item.body())
                return
            if isinstance(item, Usage):
                yield sse(out.chunk([], item))
            else:
                yield b"".join(sse(out.chunk([d])) for d in item)
    yield SSE_DONE
