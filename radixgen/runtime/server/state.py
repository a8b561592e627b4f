"""What every HTTP handler shares: `ServerState` (the engine, the served name, the limits, the
draining flag, work off the event loop, token text for logprobs) and the engine-call helpers that
turn engine errors into OpenAI errors and cancel work when the client disconnects.

Every engine call goes through `ServerState.generate` / `open_streams`, which first tokenize text
prompts on the prep threads, check the whole request against the token budget (budget.py: prompt
tokens, max_tokens against the context room, one request's KV share) and take its places in the
queue cap (429 + Retry-After when full).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request

from radixgen.common.byte_vocab import gpt2_byte_decoder
from radixgen.grammar.compiler_cache import CompilerBusy, CompileTimeout
from radixgen.runtime.scheduler.request import CONSTRAINT_UNFOLLOWABLE
from radixgen.runtime.server.budget import Admission, HeldStream, Hold, TokenBudget
from radixgen.runtime.server.options import ServerOptions
from radixgen.runtime.server.parsers import ReasoningFormat, ToolCallFormat
from radixgen.runtime.server.protocol import APIError, bad_request, error_from_value_error

T = TypeVar("T")
PREP_THREADS = 4  # threads tokenizing, templating and checking requests off the event loop


class ServerState:
    """What every handler shares: the engine, the served name, the limits (`options`), the draining
    flag, and the output parsers' formats (`--tool-call-parser`, `--reasoning-parser`)."""

    def __init__(self, engine: Any, model_name: str, options: ServerOptions | None = None,
                 tool_format: ToolCallFormat | None = None, reasoning: ReasoningFormat | None = None) -> None:
        self.engine = engine
        self.tool_format = tool_format  # None: the chat template's own
        self.reasoning = reasoning
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.options = options = options or ServerOptions()
        self.draining = False
        cfg = getattr(engine, "config", None)
        self.budget = TokenBudget(engine.tokenizer, engine.context_length,
                                  getattr(cfg, "max_total_tokens", 1 << 62), options)
        self.admission = Admission(getattr(cfg, "max_running_requests", 256) + options.max_queued_requests)
        self._prep = ThreadPoolExecutor(PREP_THREADS, thread_name_prefix="radixgen-prep")
        self._pieces: dict[int, tuple[str, list[int]]] = {}
        self._byte_decoder: dict[str, int] | None = None
        self._special: set[int] = set()
        self._template_uses_tools: bool | None = None

    # ---- checks
    def check_model(self, name: str | None) -> None:
        if name and name not in self.aliases():
            raise APIError(404, f"The model {name!r} does not exist; this server serves {self.model_name!r}",
                           "invalid_request_error", "model", "model_not_found")

    def aliases(self) -> set[str]:
        names = {self.model_name, "default"}
        path = getattr(getattr(self.engine, "config", None), "model", None)
        if path:
            names.add(str(path))
        return names

    def check_context(self, ids: list[int], param: str = "messages") -> None:
        self.budget.check_prompt(ids, param)

    def room(self, ids: list[int], n: int = 1) -> int:
        """The default max_tokens: the context room, within one request's KV share (split over n)."""
        return self.budget.default_max_tokens(ids, n)

    # ---- work off the event loop
    def prepare(self) -> None:
        """Build what the first request would otherwise build on the event loop: the engine's grammar
        backend (~1 s) and the token-length bound of the vocabulary (blocking: offload it)."""
        getattr(self.engine, "grammar_cache", None)
        self.budget.tokenize("warm", "text")

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking request work (tokenizing, templating, schema checks) on the prep threads."""
        return await asyncio.get_running_loop().run_in_executor(self._prep, fn, *args)

    def tokenize(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        """Prompt ids, refused early when the text must be over the prompt limit (blocking: offload it)."""
        return self.budget.tokenize(text, param, add_special_tokens)

    async def _admit(self, request: Request | None, kws: list[dict]) -> tuple[list[dict], list[Hold]]:
        """Tokenize text prompts off the loop, check the budget of the whole request (all of `kws`), and
        take its queue places: one Hold per engine call."""
        native = request is not None and request.url.path == "/generate"
        param = "sampling_params.max_new_tokens" if native else "max_tokens"
        kws = [await self._with_ids(kw) for kw in kws]
        prompts: list[list[int]] = []
        params: list[dict] = []
        for kw in kws:
            ids = kw.get("input_ids") or []
            lists = [ids] if isinstance(ids[0] if ids else None, int) else ids
            sps = kw.get("sampling_params") or {}
            sp_list = sps if isinstance(sps, list) else [sps] * len(lists)
            if len(sp_list) != len(lists) or not all(isinstance(x, dict) for x in sp_list) \
                    or not all(isinstance(p, list) for p in lists):
                continue  # malformed: the engine's validation names the problem
            for p in lists:
                self.check_context(p, "input_ids")
            prompts += lists
            params += sp_list
        self.budget.check_generation(prompts, params, param)
        return kws, self.admission.hold_each([_sequences(kw) for kw in kws])

    async def _with_ids(self, kw: dict) -> dict:
        """`kw` with a text `prompt` replaced by its token ids (tokenized on the prep threads)."""
        prompt = kw.get("prompt")
        if prompt is None:
            return kw
        texts = [prompt] if isinstance(prompt, str) else prompt
        ids = await self.offload(self._tokenize_texts, texts)
        return dict(kw, prompt=None, input_ids=ids[0] if isinstance(prompt, str) else ids)

    def _tokenize_texts(self, texts: list[str]) -> list[list[int]]:
        for t in texts:
            if t == "":
                raise bad_request("prompt is empty: give at least one character of text", "text")
        return [self.tokenize(t, "text") for t in texts]

    # ---- engine calls
    async def generate(self, request: Request | None, constraint_param: str | None = None,
                       raise_on_abort: bool = True, **kw: Any) -> Any:
        """`engine.async_generate(**kw)` (non-streaming), cancelled if the client disconnects (`request`
        None: work no client waits on, such as a background response);
        `constraint_param` is the request field a grammar error is blamed on. With `raise_on_abort` an
        aborted result is an error response instead of a result."""
        (kw,), (hold,) = await self._admit(request, [kw])
        try:
            out = await until_disconnect(request, engine_call(self.engine.async_generate(**kw), constraint_param))
        finally:
            hold.release()
        if raise_on_abort:
            for o in out if isinstance(out, list) else [out]:
                check_finish(o["meta_info"])
        return out

    async def open_streams(self, request: Request | None, kws: list[dict], constraint_param: str | None = None
                           ) -> list[tuple[dict, AsyncIterator[dict]]]:
        """Start streaming requests (admitted together) and wait for each one's first chunk, so that
        input errors still get a proper status code; returns (first chunk, iterator) pairs."""
        kws, holds = await self._admit(request, kws)
        its: list[AsyncIterator[dict]] = []
        try:
            for kw, hold in zip(kws, holds, strict=True):
                its.append(HeldStream(await engine_call(self.engine.async_generate(stream=True, **kw),
                                                        constraint_param), hold))
        except BaseException:
            for hold in holds[len(its):]:
                hold.release()
            for it in its:
                await it.aclose()
            raise
        try:
            firsts = await until_disconnect(request, asyncio.gather(
                *(engine_call(it.__anext__(), constraint_param) for it in its), return_exceptions=True))
            for f in firsts:
                if isinstance(f, BaseException):
                    raise f
                check_finish(f["meta_info"])
        except BaseException:
            for it in its:
                await it.aclose()
            raise
        return list(zip(firsts, its, strict=True))

    async def precache(self, ids: list[int], extra_key: str | None = None) -> None:
        """Prefill a prompt that several streams share, so they reuse its KV (n > 1)."""
        cfg = getattr(self.engine, "config", None)
        if not getattr(cfg, "disable_radix_cache", False):
            await engine_call(self.engine.async_generate(input_ids=ids, sampling_params={"max_new_tokens": 0},
                                                         extra_key=extra_key))

    # ---- token text for logprobs
    def piece(self, tid: int) -> tuple[str, list[int]]:
        """(text, utf-8 bytes) of one token, as OpenAI's logprobs report them."""
        hit = self._pieces.get(tid)
        if hit is not None:
            return hit
        hf = getattr(self.tokenizer, "hf", None)
        tok = hf.convert_ids_to_tokens(tid) if hf is not None else None
        if self._byte_decoder is None:
            self._byte_decoder = gpt2_byte_decoder()
            self._special = set(getattr(hf, "all_special_ids", ()) or ())
        if isinstance(tok, str) and tok and tid not in self._special and all(c in self._byte_decoder for c in tok):
            raw = bytes(self._byte_decoder[c] for c in tok)
            text = raw.decode("utf-8", errors="replace")
        else:
            text = self.tokenizer.decode([tid], skip_special_tokens=False)
            raw = text.encode("utf-8")
        out = (text, list(raw))
        self._pieces[tid] = out
        return out

    def template_uses_tools(self) -> bool:
        """Whether the chat template renders a `tools=` argument (else chat.py describes tools itself)."""
        if self._template_uses_tools is None:
            msgs = [{"role": "user", "content": "x"}]
            tool = {"type": "function", "function": {"name": "probe_fn_zq", "description": "d",
                                                     "parameters": {"type": "object", "properties": {}}}}
            try:
                with_tools = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tools=[tool])
                plain = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
                self._template_uses_tools = "probe_fn_zq" in with_tools and with_tools != plain
            except Exception:
                self._template_uses_tools = False
        return self._template_uses_tools


def _sequences(kw: dict) -> int:
    """How many sequences one engine call starts (prompts x n)."""
    ids = kw.get("input_ids") or []
    prompts = 1 if not ids or isinstance(ids[0], int) else len(ids)
    sps = kw.get("sampling_params") or {}
    ns = [sp.get("n", 1) if isinstance(sp, dict) else 1 for sp in (sps if isinstance(sps, list) else [sps] * prompts)]
    return sum(n if isinstance(n, int) and n > 0 else 1 for n in ns)


async def engine_call(aw: Awaitable[T], constraint_param: str | None = None) -> T:
    """Await an engine call, turning its input errors into 400s, a busy or slow grammar compiler into
    503 / 400, and a closed engine into 503."""
    try:
        return await aw
    except APIError:
        raise
    except CompilerBusy as e:
        raise APIError(503, str(e), "server_error", constraint_param, "grammar_compiler_busy") from None
    except CompileTimeout as e:
        raise bad_request(str(e), constraint_param, "grammar_compile_timeout") from None
    except ValueError as e:
        raise error_from_value_error(e, constraint_param) from None
    except RuntimeError as e:
        if "shut down" in str(e):
            raise APIError(503, "the server is shutting down", "server_unavailable", None, "shutting_down") from None
        raise


def check_finish(meta: dict) -> None:
    """Raise for a request the engine aborted before producing output worth returning."""
    fr = meta.get("finish_reason")
    if not fr or fr.get("type") != "abort":
        return
    raise abort_error(fr)


def abort_error(fr: dict) -> APIError:
    msg = fr.get("message") or "the request was aborted"
    if "shut down" in msg:
        return APIError(503, "the server is shutting down", "server_unavailable", None, "shutting_down")
    if msg.startswith(CONSTRAINT_UNFOLLOWABLE):  # the request's own constraint, not a server fault
        return bad_request(msg, None, "constraint_unfollowable")
    return APIError(500, msg, "server_error", None, "aborted")


async def until_disconnect(request: Request | None, aw: Awaitable[T]) -> T:
    """Await `aw` unless the client disconnects first; then cancel it (the engine aborts the request).
    Without a request (background work) just await it."""
    if request is None:
        return await aw
    task = asyncio.ensure_future(aw)
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task})
        raise
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.wait({task})  # let the cancellation run (it aborts the engine request) before moving on
    raise APIError(499, "client disconnected", "client_closed_request")


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
