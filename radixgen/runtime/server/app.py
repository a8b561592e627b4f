"""The HTTP server: `create_app(engine, api_key=None, model_name=...)` builds a FastAPI app over an Engine.

Routes (OpenAI-compatible unless noted):

- POST /v1/chat/completions (chat.py), POST /v1/completions (completions.py), GET /v1/models[/{id}]
- POST /v1/embeddings and SGLang's native POST /encode (embeddings.py)
- POST /v1/responses, GET|DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel (responses.py)
- GET /health: 200 while serving, 503 once shutting down
- SGLang's native routes (native.py): POST /generate, GET /get_model_info, GET /get_server_info,
  POST /concate_and_append_request, GET|POST /flush_cache, POST /abort_request, POST /tokenize, ...
- GET /metrics: Prometheus text with SGLang's metric names (runtime/observability/); GET /stats: the
  engine's own counters as JSON

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
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixgen.runtime.observability import exposition
from radixgen.runtime.observability.observer import served_model_name
from radixgen.runtime.observability.tracing import TraceContextMiddleware
from radixgen.runtime.server import chat, completions, embeddings, native, responses
from radixgen.runtime.server.auth import Gate
from radixgen.runtime.server.body_checks import GuardedRoute
from radixgen.runtime.server.chat_templates import load_chat_template
from radixgen.runtime.server.http_guard import HTTPGuard
from radixgen.runtime.server.loop_watch import LoopStallDump
from radixgen.runtime.server.options import ServerOptions
from radixgen.runtime.server.parsers import reasoning_format_named, tool_format_named
from radixgen.runtime.server.protocol import (
    APIError,
    ModelCard,
    ModelList,
    bad_request,
    error_from_value_error,
)
from radixgen.runtime.server.state import ServerState

logger = logging.getLogger("radixgen.server")


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=getattr(e, "headers", None))


# ---------------------------------------------------------------------------------------------- app


def create_app(engine: Any, api_key: str | None = None, model_name: str | None = None,
               options: ServerOptions | None = None, tool_call_parser: str | None = None,
               reasoning_parser: str | None = None) -> FastAPI:
    """A FastAPI app serving `engine`; `model_name` is the id clients pass as `model`, `options` the
    request limits (ServerOptions' defaults when None); the parsers are the `--tool-call-parser` /
    `--reasoning-parser` names (parsers/)."""
    if model_name is None:
        model_name = served_model_name(getattr(getattr(engine, "config", None), "model", None))
    engine.observer.set_labels(model_name=model_name)
    state = ServerState(engine, model_name, options, tool_format_named(tool_call_parser),
                        reasoning_format_named(reasoning_parser))
    if state.options.chat_template is not None:  # the server's template for every chat render (SGLang's flag)
        engine.tokenizer.chat_template = load_chat_template(state.options.chat_template)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.offload(state.prepare)  # so that no first request builds these on the event loop
        watch = LoopStallDump(state.options.loop_stall_dump) if state.options.loop_stall_dump else None
        if watch is not None:
            watch.start()
        yield
        if watch is not None:
            await watch.stop()

    app = FastAPI(title="radixgen", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.router.route_class = GuardedRoute  # every route checks its body first (body_checks.py)
    app.state.radixgen = state
    app.add_middleware(TraceContextMiddleware)  # an HTTP request's traceparent parents its engine spans
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

    @app.get("/metrics")
    async def metrics() -> Response:
        await asyncio.to_thread(engine.observer.refresh)
        body, content_type = exposition.render(engine.observer.metrics.registry)
        return Response(body, media_type=content_type)

    @app.get("/stats")
    async def stats() -> Response:
        return JSONResponse(exposition.stats_json(await asyncio.to_thread(engine.get_stats)))

    chat.register(app, state)
    completions.register(app, state)
    embeddings.register(app, state)
    native.register(app, state)
    responses.register(app, state, keyed=api_key is not None)
    return app
