"""Engine: the in-process entry point (generate / async_generate / abort / flush_cache / shutdown).

Requests are tokenized and validated on the caller's thread, then handed to the scheduler thread,
which batches them continuously with everything else in flight. Results come back through a
per-request channel: a `queue.Queue` for the sync API, an `asyncio.Queue` for the async one.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from radixgen.common.exit_hooks import ENGINES, at_exit
from radixgen.common.heap import release_free_memory
from radixgen.grammar import GrammarCache, make_router, spec_from_params
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.device import check_device
from radixgen.runtime.distributed import make_model_runner
from radixgen.runtime.executor.worker import ModelWorker
from radixgen.runtime.observability.observer import Observer
from radixgen.runtime.scheduler.kv_manager import KVManager
from radixgen.runtime.scheduler.request import Req
from radixgen.runtime.scheduler.scheduler import Scheduler
from radixgen.runtime.threads import on_short_lived_thread
from radixgen.runtime.tokenizer import IncrementalDetokenizer, load_tokenizer
from radixgen.sampling.params import SamplingParams

logger = logging.getLogger(__name__)
Prompt = str | list[str] | None
Ids = list[int] | list[list[int]] | None
POOLINGS = ("last", "mean")  # how `encode` pools a prompt's final hidden states


class Engine:
    """An LLM engine in this process: `Engine(model=None, **EngineConfig fields)`.

    A library object: it changes no process-wide state that another engine or the embedding program
    relies on. Settings that belong to the whole process are made by whoever owns it: `radixgen serve`
    freezes its start-up heap out of the garbage collector after warm-up
    (`radixgen.runtime.server.memory.freeze_startup_heap`, which shortens full collections: a random
    tiny Llama at batch 256 on CPU, 20-22 -> 15-17 ms a step); a program that owns its process and
    keeps one engine for its lifetime may call it likewise once the engine is up.
    """

    def __init__(self, model: str | None = None, **config: Any) -> None:
        if "model_path" in config:  # SGLang's name for it
            if model is not None:
                raise TypeError("give model or model_path, not both")
            model = config.pop("model_path")
        unknown = sorted(set(config) - set(EngineConfig.field_names()))
        if unknown:
            raise TypeError(f"unknown Engine option {unknown[0]!r}; options: {', '.join(EngineConfig.field_names())}")
        self.config = EngineConfig(model=model, **config)
        check_device(self.config.device)
        t0 = time.perf_counter()
        self.tokenizer = load_tokenizer(model)
        release_free_memory()  # what parsing the tokenizer freed, before the weights' pages add to the peak
        self.runner = on_short_lived_thread(lambda: make_model_runner(self.config))
        self.config = replace(self.config, max_total_tokens=self.runner.memory.kv_tokens)  # as the pool was sized
        self.model_config = self.runner.model_config
        self.context_length = self.runner.context_length
        # loading the weights frees what it staged (on its own thread's heap); glibc would hold those pages
        release_free_memory()
        eos = set(self.tokenizer.eos_token_ids) | set(self.model_config.eos_token_ids)
        kv = KVManager(self.runner.req_to_token_pool, self.runner.token_to_kv_pool, self.config.page_size,
                       self.config.disable_radix_cache)
        worker = ModelWorker(self.config, self.runner, eos)
        self.scheduler = Scheduler(self.config, worker, kv, self.context_length, eos)
        self.observer = Observer(self.config, self.tokenizer, self.get_stats, self.context_length)
        self._rng = random.Random(self.config.seed)
        self._grammar_cache: GrammarCache | None = None
        self._closed = False
        # stopped (threads joined) at interpreter exit if the program did not: see common/exit_hooks.py
        self._cancel_exit_hook = at_exit(self.shutdown, ENGINES, weak=True)
        logger.info("engine ready in %.1f s (KV pool %d tokens, context %d)", time.perf_counter() - t0,
                    self.config.max_total_tokens, self.context_length)

    # ------------------------------------------------------------------ constraints

    @property
    def grammar_cache(self) -> GrammarCache:
        """Compiled-grammar cache of the grammar router, configured backend first (built on first use)."""
        if self._grammar_cache is None:
            backend = make_router(self.config.grammar_backend, self.tokenizer, self.model_config.vocab_size)
            cfg = self.config
            self._grammar_cache = GrammarCache(backend, max_workers=cfg.grammar_compile_threads,
                                               timeout=cfg.grammar_compile_timeout or None,
                                               on_compiled=self.observer.on_grammar_compiled)
        return self._grammar_cache

    def _constraint(self, params: SamplingParams) -> Future | None:
        """Start compiling the request's constraint (cached, off the scheduler thread), or None."""
        spec = spec_from_params(params.json_schema, params.regex, params.ebnf, params.structural_tag,
                                any_whitespace=params.any_whitespace, strict=params.strict_schema)
        return None if spec is None else self.grammar_cache.get_or_compile(spec)

    def _attach_grammars(self, reqs: list[Req], futures: list[Future | None]) -> None:
        """Give each constrained request its own matcher (raises GrammarError for a bad constraint)."""
        for req, fut in zip(reqs, futures, strict=True):
            if fut is not None:
                budget = req.params.max_new_tokens if req.params.budget_aware else None
                req.grammar = self.grammar_cache.backend.matcher(fut.result(), budget=budget)

    # ------------------------------------------------------------------ request building

    def _inputs(self, prompt: Prompt, input_ids: Ids) -> tuple[list[list[int]], bool]:
        """Tokenize; return (one id list per prompt, whether the caller passed a single prompt)."""
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of `prompt` (str or list of str) and `input_ids`")
        if prompt is not None:
            single = isinstance(prompt, str)
            texts = [prompt] if single else list(prompt)
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("prompt must be a str or a list of str")
            for t in texts:
                if t == "":
                    raise ValueError("prompt is empty: give at least one character of text")
            return [self.tokenizer.encode(t) for t in texts], single
        single = bool(input_ids) and isinstance(input_ids[0], int)
        lists = [list(input_ids)] if single else [list(x) for x in input_ids]
        for ids in lists:
            if not ids:
                raise ValueError("input_ids is empty: give at least one token id")
            bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.model_config.vocab_size]
            if bad:
                raise ValueError(f"input_ids holds {bad[0]!r}, not a token id in [0, {self.model_config.vocab_size})")
        return lists, single

    def _params(self, sampling_params: dict | list[dict] | None, count: int) -> list[SamplingParams]:
        if isinstance(sampling_params, list):
            if len(sampling_params) != count:
                raise ValueError(f"got {len(sampling_params)} sampling_params for {count} prompts")
            dicts = sampling_params
        else:
            dicts = [sampling_params or {}] * count
        out = []
        for d in dicts:
            p = d if isinstance(d, SamplingParams) else SamplingParams.from_dict(d)
            p.validate(self.model_config.vocab_size)
            out.append(p)
        return out

    def _make_req(self, ids: list[int], params: SamplingParams, emit: Callable[[dict], None], *, stream: bool,
                  return_logprob: bool, logprob_start_len: int, top_logprobs_num: int,
                  extra_key: str | None, rid: str | None, pooling: str | None = None) -> Req:
        if len(ids) >= self.context_length:
            raise ValueError(
                f"prompt has {len(ids)} tokens, which does not fit the context length {self.context_length}: "
                f"shorten the prompt"
            )
        if len(ids) + 1 > self.config.max_total_tokens:
            raise ValueError(f"prompt has {len(ids)} tokens, more than the KV pool ({self.config.max_total_tokens})")
        room = self.context_length - len(ids)
        if params.max_new_tokens > room:
            params = replace(params, max_new_tokens=room)
        if return_logprob:
            params = replace(params, logprobs=True, top_logprobs=max(params.top_logprobs, top_logprobs_num))
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        detok = IncrementalDetokenizer(self.tokenizer, ids, list(params.stop), params.skip_special_tokens)
        return Req(
            rid=rid or uuid.uuid4().hex, input_ids=ids, params=params, seed=seed, detok=detok, emit=emit,
            return_logprob=return_logprob, logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num, extra_key=extra_key, stream=stream, pooling=pooling,
        )

    def _expand(self, prompt: Prompt, sampling_params: Any, input_ids: Ids) -> tuple[list[tuple], bool]:
        """(ids, params, index) for every sequence to run (n > 1 gives n sequences per prompt)."""
        id_lists, single = self._inputs(prompt, input_ids)
        params = self._params(sampling_params, len(id_lists))
        seqs = []
        for ids, p in zip(id_lists, params, strict=True):
            for k in range(p.n):
                seed = p.seed + k if p.seed is not None and p.n > 1 else p.seed
                seqs.append((ids, replace(p, n=1, seed=seed)))
        return seqs, single and len(seqs) == 1

    def _prepare(self, prompt: Prompt, sampling_params: Any, input_ids: Ids, stream: bool, return_logprob: bool,
                 logprob_start_len: int, top_logprobs_num: int, extra_key: str | None) -> tuple[list, bool, dict]:
        """Checks and expansion shared by generate and async_generate: (seqs, single, request options)."""
        if self._closed:
            raise RuntimeError("this Engine has been shut down")
        seqs, single = self._expand(prompt, sampling_params, input_ids)
        if stream and len(seqs) != 1:
            raise ValueError("stream=True takes a single prompt with n=1")
        opts = dict(return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                    top_logprobs_num=top_logprobs_num, extra_key=extra_key)
        return seqs, single, opts

    def _new_requests(self, seqs: list[tuple], emits: list[Callable[[dict], None]], rid: str | None, stream: bool,
                      opts: dict) -> tuple[list[Req], list[Future | None]]:
        """The requests of `seqs` (each answering through its `emit`) and their constraint compiles
        (started here, off the scheduler thread)."""
        compiles = [self._constraint(p) for _, p in seqs]
        reqs = [self._make_req(ids, p, emit, stream=stream, rid=rid, **opts)
                for (ids, p), emit in zip(seqs, emits, strict=True)]
        for req, compile_ in zip(reqs, compiles, strict=True):
            self.observer.watch(req, compile_)  # metrics, request log, trace when it finishes
        return reqs, compiles

    def _submit(self, reqs: list[Req]) -> None:
        for r in reqs:
            self.scheduler.add_request(r)

    # ------------------------------------------------------------------ sync API

    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: Ids = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        extra_key: str | None = None,
        rid: str | None = None,
    ) -> dict | list[dict] | Iterator[dict]:
        """Generate for one prompt (returns a dict) or a list (returns a list of dicts).

        With `n > 1` a prompt gives n results (its KV is computed once and shared). `stream=True`
        (single prompt) returns an iterator of chunks whose "text" is the new text.
        """
        seqs, single, opts = self._prepare(prompt, sampling_params, input_ids, stream, return_logprob,
                                           logprob_start_len, top_logprobs_num, extra_key)
        channels: list[queue.Queue] = [queue.Queue() for _ in seqs]
        reqs, compiles = self._new_requests(seqs, [q.put for q in channels], rid if single else None, stream, opts)
        self._attach_grammars(reqs, compiles)  # waits for compiles on this thread, not the scheduler's
        self._precache(seqs, extra_key)
        self._submit(reqs)
        if stream:
            return self._chunks(reqs[0], channels[0])
        results = [q.get() for q in channels]
        return results[0] if single else results

    def _precache(self, seqs: list[tuple], extra_key: str | None) -> None:
        """Prefill prompts that several sequences share (n > 1) once, so they reuse its KV."""
        shared = _shared_prompts(seqs)
        if shared and not self.config.disable_radix_cache:
            self.generate(input_ids=shared, sampling_params={"max_new_tokens": 0}, extra_key=extra_key)

    def _chunks(self, req: Req, channel: queue.Queue) -> Iterator[dict]:
        """A streamed request's chunks until its last; a consumer that stops early aborts it."""
        try:
            while True:
                chunk = channel.get()
                yield chunk
                if chunk["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            if req.finished is None:
                self.abort(req.rid)

    # ------------------------------------------------------------------ async API

    async def async_generate(
        self,
        prompt: Prompt = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: Ids = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        extra_key: str | None = None,
        rid: str | None = None,
    ) -> dict | list[dict] | AsyncIterator[dict]:
        """asyncio twin of `generate`; with stream=True returns an async iterator of chunks."""
        seqs, single, opts = self._prepare(prompt, sampling_params, input_ids, stream, return_logprob,
                                           logprob_start_len, top_logprobs_num, extra_key)
        loop = asyncio.get_running_loop()
        channels: list[asyncio.Queue] = [asyncio.Queue() for _ in seqs]
        emits = [_threadsafe_put(loop, q) for q in channels]
        reqs, compiles = self._new_requests(seqs, emits, rid if single else None, stream, opts)
        await asyncio.gather(*[asyncio.wrap_future(c) for c in compiles if c is not None], return_exceptions=True)
        self._attach_grammars(reqs, compiles)
        if _shared_prompts(seqs):
            await loop.run_in_executor(None, self._precache, seqs, extra_key)
        self._submit(reqs)
        if stream:
            return self._achunks(reqs[0], channels[0])
        try:
            results = list(await asyncio.gather(*[q.get() for q in channels]))
        except asyncio.CancelledError:
            for r in reqs:
                self.abort(r.rid)
            raise
        return results[0] if single else results

    async def _achunks(self, req: Req, channel: asyncio.Queue) -> AsyncIterator[dict]:
        """asyncio twin of `_chunks`."""
        try:
            while True:
                chunk = await channel.get()
                yield chunk
                if chunk["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            if req.finished is None:
                self.abort(req.rid)

    # ------------------------------------------------------------------ embeddings

    def _encode_requests(self, prompt: Prompt, input_ids: Ids, pooling: str,
                         emits: Callable[[int], list[Callable[[dict], None]]]) -> tuple[list[Req], bool]:
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        seqs, single, opts = self._prepare(prompt, {"max_new_tokens": 0}, input_ids, False, False, -1, 0, None)
        reqs, _ = self._new_requests(seqs, emits(len(seqs)), None, False, dict(opts, pooling=pooling))
        return reqs, single

    def encode(self, prompt: Prompt = None, input_ids: Ids = None, pooling: str = "last") -> dict | list[dict]:
        """Embed one prompt (returns a dict) or a list (returns a list of dicts): `{"embedding": [floats],
        "meta_info": {...}}`, the final norm's output pooled over the prompt (`pooling`: its last token,
        or the mean of all its tokens) and L2-normalized. Runs as a prefill-only request batched with
        everything else; its KV goes to the radix cache like any prompt's."""
        channels: list[queue.Queue] = []

        def emits(n: int) -> list[Callable[[dict], None]]:
            channels.extend(queue.Queue() for _ in range(n))
            return [q.put for q in channels]

        reqs, single = self._encode_requests(prompt, input_ids, pooling, emits)
        self._submit(reqs)
        results = [q.get() for q in channels]
        return results[0] if single else results

    async def async_encode(self, prompt: Prompt = None, input_ids: Ids = None,
                           pooling: str = "last") -> dict | list[dict]:
        """asyncio twin of `encode`; cancelling it aborts its requests."""
        loop = asyncio.get_running_loop()
        channels: list[asyncio.Queue] = []

        def emits(n: int) -> list[Callable[[dict], None]]:
            channels.extend(asyncio.Queue() for _ in range(n))
            return [_threadsafe_put(loop, q) for q in channels]

        reqs, single = self._encode_requests(prompt, input_ids, pooling, emits)
        self._submit(reqs)
        try:
            results = list(await asyncio.gather(*[q.get() for q in channels]))
        except asyncio.CancelledError:
            for r in reqs:
                self.abort(r.rid)
            raise
        return results[0] if single else results

    # ------------------------------------------------------------------ control

    def abort(self, rid: str) -> None:
        """Abort a request by id; its KV is released at the scheduler's next step."""
        self.scheduler.abort(rid)

    def flush_cache(self) -> bool:
        """Empty the radix cache; only when no request is in flight (returns False otherwise)."""
        return bool(self.scheduler.call("flush_cache", timeout=60))

    def get_stats(self) -> dict:
        """Running/waiting counts, KV usage, cache hit rate, throughput and latency histograms."""
        return dict(self.scheduler.call("stats", timeout=60))

    def shutdown(self) -> None:
        """Stop the engine's threads (joined); requests in flight finish with reason "abort". Called at
        interpreter exit for an engine still running then."""
        if not self._closed:
            self._closed = True
            self._cancel_exit_hook()
            self.observer.shutdown()
            self.scheduler.shutdown()
            self.runner.close()
            if self._grammar_cache is not None:
                self._grammar_cache.shutdown(wait=False)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _shared_prompts(seqs: list[tuple]) -> list[list[int]]:
    """Prompts that more than one sequence starts from."""
    counts: dict[tuple[int, ...], int] = {}
    for ids, _ in seqs:
        counts[tuple(ids)] = counts.get(tuple(ids), 0) + 1
    return [list(k) for k, c in counts.items() if c > 1]


def _threadsafe_put(loop: asyncio.AbstractEventLoop, q: asyncio.Queue) -> Callable[[dict], None]:
    """An emit callback for the scheduler thread that puts chunks on an asyncio queue of `loop`."""
    return lambda chunk: loop.call_soon_threadsafe(q.put_nowait, chunk)
