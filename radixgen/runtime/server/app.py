"""The HTTP server: `create_app(engine, api_key=None, model_name=...)` builds a FastAPI app over an Engine.

Routes (OpenAI-compatible unless noted):

- POST /v1/chat/completions (chat.py), POST /v1/completions (completions.py), GET /v1/models[/{id}]
- GET /health: 200 while serving, 503 once shutting down
- POST /generate (native): the engine's `async_generate` arguments as JSON (`text` or `input_ids`,
  `sampling_params`, `return_logprob`, `logprob_start_len`, `top_logprobs_num`, `rid`, `extra_key`);
  returns the engine's dict (a list for several prompts or n > 1). With `"stream": true` it answers
  Server-Sent Events, one engine chunk per event, whose `text` and `output_ids` are DELTAS (the new
  text / ids since the previous event, exactly as the engine's own stream), then `data: [DONE]`.
- POST /flush_cache: `{"success": bool}` (false while requests are in flight: poll)
- GET /metrics: Prometheus text (metrics_text.py); GET /stats: the same numbers as JSON
- GET /get_model_info: model name and path, context length, the chat template text and special tokens
  (what `RuntimeEndpoint` needs to render roles client-side); POST /tokenize, POST /detokenize

Errors use OpenAI's body `{"error": {"message", "type", "param", "code"}}`: 400 for invalid parameters
(pydantic's 422 is turned into 400) and prompts over the context length (code
"context_length_exceeded"), 401 for a missing / wrong bearer key when `api_key` is set, 404 for unknown
models and routes, 503 while shutting down.

Hardening (the request-handling side lives in its own modules, hooked in here):
- http_guard.py: request ids, the body-size cap (413), a catch-all turning a bug into a logged 500
  naming the request id; auth.py: the API key (constant-time) and the draining gate;
- body_checks.py (the route class): UTF-8, JSON, lone surrogates, and limits.py's per-field limits
  (n, stop, tools, schema size and depth), all before a route runs;
- budget.py: prompt tokens, max_tokens against the context room, the KV share of one request, and the
  queue cap (429 + Retry-After), applied to every engine call made through `ServerState`;
- nothing heavy on the event loop: tokenization, chat templating, constraint checks and large body
  parsing run on `ServerState.offload`'s threads, so /health and other requests stay responsive.

Disconnects: a streaming response closes the engine's async iterator when the client goes away (the
iterator's `finally` aborts the request); non-streaming handlers race the engine call against the
ASGI `http.disconnect` message and cancel it, which aborts the request too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import StreamingResponse

from radixgen.common.byte_vocab import gpt2_byte_decoder
from radixgen.grammar.compiler_cache import CompilerBusy, CompileTimeout
from radixgen.runtime.server.auth import Gate
from radixgen.runtime.server.body_checks import GuardedRoute
from radixgen.runtime.server.budget import Admission, HeldStream, Hold, TokenBudget
from radixgen.runtime.server.http_guard import HTTPGuard
from radixgen.runtime.server.options import ServerOptions
from radixgen.runtime.server.protocol import (
    APIError,
    DetokenizeRequest,
    GenerateRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
    bad_request,
    error_from_value_error,
)

logger = logging.getLogger("radixgen.server")
T = TypeVar("T")
PREP_THREADS = 4  # threads tokenizing, templating and checking requests off the event loop


class ServerState:
    """What every handler shares: the engine, the served name, the limits, the draining flag."""

    def __init__(self, engine: Any, model_name: str, options: ServerOptions | None = None) -> None:
        self.engine = engine
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
    def warm_up(self) -> None:
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

    async def _admit(self, request: Request, kws: list[dict]) -> tuple[list[dict], list[Hold]]:
        """Tokenize text prompts off the loop, check the budget of the whole request (all of `kws`), and
        take its queue places: one Hold per engine call."""
        param = "sampling_params.max_new_tokens" if request.url.path == "/generate" else "max_tokens"
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
    async def generate(self, request: Request, constraint_param: str | None = None, raise_on_abort: bool = True,
                       **kw: Any) -> Any:
        """`engine.async_generate(**kw)` (non-streaming), cancelled if the client disconnects;
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

    async def open_streams(self, request: Request, kws: list[dict], constraint_param: str | None = None
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
            for hold in holds:
                hold.release()
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




# ---------------------------------------------------------------------------------------------- helpers


def _sequences(kw: dict) -> int:
    """How many sequences one engine call starts (prompts x n)."""
    ids = kw.get("input_ids") or []
    prompts = 1 if not ids or isinstance(ids[0], int) else len(ids)
    sps = kw.get("sampling_params") or {}
    ns = [sp.get("n", 1) if isinstance(sp, dict) else 1 for sp in (sps if isinstance(sps, list) else [sps] * prompts)]
    return sum(n if isinstance(n, int) and n > 0 else 1 for n in ns)


async def engine_call(aw: Awaitable[T], constraint_param: str | None = None) -> T:
    """Await an engine call, turning its input errors into 400s and a closed engine into 503."""
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
    return APIError(500, msg, "server_error", None, "aborted")


async def until_disconnect(request: Request, aw: Awaitable[T]) -> T:
    """Await `aw` unless the client disconnects first; then cancel it (the engine aborts the request)."""
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


def sse(obj: Any) -> bytes:
    """One SSE event. Pydantic chunks drop None fields, except each choice's `finish_reason`, which
    OpenAI's stream chunks always carry (null until the last one)."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(exclude_none=True)
        for choice in obj.get("choices", ()):
            choice.setdefault("finish_reason", None)
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class SSEResponse(StreamingResponse):
    """Server-Sent Events whose body iterator is always closed, also when the client disconnects
    (closing it closes the engine stream, which aborts the request)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def merge_streams(streams: list[tuple[dict, AsyncIterator[dict]]]) -> AsyncIterator[tuple[int, dict]]:
    """Yield (index, chunk) from several primed engine streams as chunks arrive; close all at the end."""
    if len(streams) == 1:
        first, it = streams[0]
        try:
            yield 0, first
            if first["meta_info"]["finish_reason"] is None:
                async for chunk in it:
                    yield 0, chunk
        finally:
            await it.aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, first: dict, it: AsyncIterator[dict]) -> None:
        try:
            await queue.put((i, first))
            if first["meta_info"]["finish_reason"] is None:
                async for chunk in it:
                    await queue.put((i, chunk))
        except BaseException as e:  # surfaced to the consumer
            await queue.put((i, e))
            raise
        finally:
            await it.aclose()

    tasks = [asyncio.ensure_future(pump(i, f, it)) for i, (f, it) in enumerate(streams)]
    open_ = len(streams)
    try:
        while open_:
            i, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item["meta_info"]["finish_reason"] is not None:
                open_ -= 1
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=getattr(e, "headers", None))


# ---------------------------------------------------------------------------------------------- app


def create_app(engine: Any, api_key: str | None = None, model_name: str | None = None,
               options: ServerOptions | None = None) -> FastAPI:
    """A FastAPI app serving `engine`; `model_name` is the id clients pass as `model`, `options` the
    request limits (ServerOptions' defaults when None)."""
    from radixgen.runtime.server import chat, completions, metrics_text

    if model_name is None:
        path = getattr(getattr(engine, "config", None), "model", None)
        model_name = str(path).rstrip("/").rsplit("/", 1)[-1] if path else "smollm2-135m-instruct"
    state = ServerState(engine, model_name, options)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.offload(state.warm_up)  # so that no first request builds these on the event loop
        yield

    app = FastAPI(title="radixgen", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.router.route_class = GuardedRoute  # every route checks its body first (body_checks.py)
    app.state.radixgen = state
    app.add_middleware(Gate, state=state, api_key=api_key, public_metrics=state.options.public_metrics)
    app.add_middleware(HTTPGuard, max_body=state.options.max_request_bytes)  # outermost

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x not in ("body",)]
        param = ".".join(loc) or None
        msg = first.get("msg", "invalid request")
        return error_response(bad_request(f"{param}: {msg}" if param else msg, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        msg = f"{e.detail}" if e.status_code != 404 else "Not found: no such route"
        return error_response(APIError(e.status_code, msg, "invalid_request_error", None, kind))

    @app.exception_handler(ValueError)
    async def _value(_: Request, e: ValueError) -> JSONResponse:
        return error_response(error_from_value_error(e))

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> Response:
        card = ModelCard(id=state.model_name, root=state.model_name, max_model_len=engine.context_length)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        state.check_model(model_id)
        card = ModelCard(id=state.model_name, root=state.model_name, max_model_len=engine.context_length)
        return JSONResponse(card.model_dump())

    @app.get("/get_model_info")
    async def model_info() -> Response:
        tok = state.tokenizer
        hf = getattr(tok, "hf", None)
        return JSONResponse({
            "model_name": state.model_name,
            "model_path": str(getattr(getattr(engine, "config", None), "model", None) or ""),
            "context_length": engine.context_length,
            "vocab_size": getattr(tok, "vocab_size", None),
            "chat_template": getattr(tok, "chat_template", None),
            "special_tokens_map": dict(getattr(hf, "special_tokens_map", {}) or {}),
            "bos_token_id": getattr(hf, "bos_token_id", None),
            "eos_token_ids": list(tok.eos_token_ids),
            "all_special_ids": list(getattr(hf, "all_special_ids", []) or []),
        })

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> Response:
        texts = [req.text] if isinstance(req.text, str) else req.text
        ids = await state.offload(lambda: [state.tokenizer.encode(t, add_special_tokens=req.add_special_tokens)
                                           for t in texts])
        return JSONResponse({"tokens": ids[0] if isinstance(req.text, str) else ids})

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> Response:
        vocab = state.tokenizer.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"tokens holds {bad}, not a token id in [0, {vocab})", "tokens")
        text = await state.offload(state.tokenizer.decode, req.tokens, req.skip_special_tokens)
        return JSONResponse({"text": text})

    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request) -> Response:
        kw = dict(prompt=req.text, input_ids=req.input_ids, sampling_params=req.sampling_params,
                  return_logprob=req.return_logprob, logprob_start_len=req.logprob_start_len,
                  top_logprobs_num=req.top_logprobs_num, extra_key=req.extra_key, rid=req.rid)
        if not req.stream:
            return JSONResponse(await state.generate(request, "sampling_params", raise_on_abort=False, **kw))
        streams = await state.open_streams(request, [kw], "sampling_params")

        async def events() -> AsyncIterator[bytes]:
            async for _, chunk in merge_streams(streams):
                yield sse(chunk)
            yield SSE_DONE

        return SSEResponse(events())

    @app.post("/flush_cache")
    async def flush_cache() -> Response:
        ok = await asyncio.to_thread(engine.flush_cache)
        return JSONResponse({"success": bool(ok), "message": "cache flushed" if ok else
                             "requests are in flight; the cache was not flushed (retry when idle)"})

    @app.get("/metrics")
    async def metrics() -> Response:
        stats = await asyncio.to_thread(engine.get_stats)
        return PlainTextResponse(metrics_text.render(stats, state.model_name),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/stats")
    async def stats() -> Response:
        return JSONResponse(metrics_text.to_json(await asyncio.to_thread(engine.get_stats)))

    chat.register(app, state)
    completions.register(app, state)
    return app
