"""The HTTP server: `create_app(engine, api_key=None, model_name=...)` builds a FastAPI app over an Engine.

Routes (OpenAI-compatible unless noted):

- POST /v1/chat/completions (chat.py), POST /v1/completions (completions.py), GET /v1/models[/{id}]
- GET /health: 200 while serving, 503 once shutting down
- SGLang's native routes (native.py): POST /generate, GET /get_model_info, GET /get_server_info,
  POST /concate_and_append_request, GET|POST /flush_cache, POST /abort_request, POST /tokenize, ...
- GET /metrics: Prometheus text (metrics_text.py); GET /stats: the same numbers as JSON

Errors use OpenAI's body `{"error": {"message", "type", "param", "code"}}`: 400 for invalid parameters
(pydantic's 422 is turned into 400) and prompts over the context length (code
"context_length_exceeded"), 401 for a missing / wrong bearer key when `api_key` is set, 404 for unknown
models and routes, 503 while shutting down.

Disconnects: a streaming response closes the engine's async iterator when the client goes away (the
iterator's `finally` aborts the request); non-streaming handlers race the engine call against the
ASGI `http.disconnect` message and cancel it, which aborts the request too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import StreamingResponse

from radixgen.common.byte_vocab import gpt2_byte_decoder
from radixgen.runtime.server.protocol import (
    APIError,
    ModelCard,
    ModelList,
    bad_request,
    error_from_value_error,
)

logger = logging.getLogger("radixgen.server")
T = TypeVar("T")
OPEN_PATHS = frozenset({"/health"})  # reachable without the API key


class ServerState:
    """What every handler shares: the engine, the served name, the key, the draining flag."""

    def __init__(self, engine: Any, model_name: str, api_key: str | None) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.api_key = api_key
        self.draining = False
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
        limit = self.engine.context_length
        if len(ids) >= limit:
            raise bad_request(f"This model's maximum context length is {limit} tokens, but the prompt has "
                              f"{len(ids)} tokens; shorten the prompt", param, "context_length_exceeded")

    def room(self, ids: list[int]) -> int:
        return max(self.engine.context_length - len(ids), 0)

    # ---- engine calls
    async def generate(self, request: Request, constraint_param: str | None = None, **kw: Any) -> Any:
        """`engine.async_generate(**kw)` (non-streaming), cancelled if the client disconnects;
        `constraint_param` is the request field a grammar error is blamed on."""
        out = await until_disconnect(request, engine_call(self.engine.async_generate(**kw), constraint_param))
        for o in out if isinstance(out, list) else [out]:
            check_finish(o["meta_info"])
        return out

    async def open_streams(self, request: Request, kws: list[dict], constraint_param: str | None = None
                           ) -> list[tuple[dict, AsyncIterator[dict]]]:
        """Start streaming requests (admitted together) and wait for each one's first chunk, so that
        input errors still get a proper status code; returns (first chunk, iterator) pairs."""
        its = [await engine_call(self.engine.async_generate(stream=True, **kw), constraint_param) for kw in kws]
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


async def engine_call(aw: Awaitable[T], constraint_param: str | None = None) -> T:
    """Await an engine call, turning its input errors into 400s and a closed engine into 503."""
    try:
        return await aw
    except APIError:
        raise
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
    return JSONResponse(e.body(), status_code=e.status)


# ---------------------------------------------------------------------------------------------- app


class _Gate:
    """Pure-ASGI middleware: bearer-key check and 503 while draining (cheaper than BaseHTTPMiddleware)."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            err = self._check(scope)
            if err is not None:
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, scope: dict) -> APIError | None:
        st = self.state
        if st.draining:
            return APIError(503, "the server is shutting down", "server_unavailable", None, "shutting_down")
        if st.api_key and scope["path"] not in OPEN_PATHS:
            headers = dict(scope["headers"])
            auth = headers.get(b"authorization", b"").decode("latin-1")
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get(b"x-api-key", b"").decode()
            if key != st.api_key:
                return APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                                "invalid_request_error", None, "invalid_api_key")
        return None


def create_app(engine: Any, api_key: str | None = None, model_name: str | None = None) -> FastAPI:
    """A FastAPI app serving `engine`; `model_name` is the id clients pass as `model`."""
    from radixgen.runtime.server import chat, completions, metrics_text, native

    if model_name is None:
        path = getattr(getattr(engine, "config", None), "model", None)
        model_name = str(path).rstrip("/").rsplit("/", 1)[-1] if path else "smollm2-135m-instruct"
    state = ServerState(engine, model_name, api_key)
    app = FastAPI(title="radixgen", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.radixgen = state
    app.add_middleware(_Gate, state=state)

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
    native.register(app, state)
    return app
