"""The HTTP server: `create_app(engine, api_key=None, model_name=...)` builds a FastAPI app over an Engine.

Routes (OpenAI-compatible unless noted):

- POST /v1/chat/completions (chat.py), POST /v1/completions (completions.py), GET /v1/models[/{id}]
- GET /health: 200 while serving, 503 once shutting down
- SGLang's native routes (native.py): POST /generate, GET /get_model_info, GET /get_server_info,
  POST /concate_and_append_request, GET|POST /flush_cache, POST /abort_request, POST /tokenize, ...
- GET /metrics: Prometheus text with SGLang's metric names (runtime/observability/); GET /stats: the
  engine's own counters as JSON

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
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixgen.runtime.observability import exposition
from radixgen.runtime.observability.observer import served_model_name
from radixgen.runtime.observability.tracing import TraceContextMiddleware
from radixgen.runtime.server import chat, completions, native
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
OPEN_PATHS = frozenset({"/health"})  # reachable without the API key


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


def create_app(engine: Any, api_key: str | None = None, model_name: str | None = None,
               tool_call_parser: str | None = None, reasoning_parser: str | None = None) -> FastAPI:
    """A FastAPI app serving `engine`; `model_name` is the id clients pass as `model`; the parsers are
    the `--tool-call-parser` / `--reasoning-parser` names (parsers/)."""
    if model_name is None:
        model_name = served_model_name(getattr(getattr(engine, "config", None), "model", None))
    engine.observer.set_labels(model_name=model_name)
    state = ServerState(engine, model_name, api_key, tool_format_named(tool_call_parser),
                        reasoning_format_named(reasoning_parser))
    app = FastAPI(title="radixgen", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.radixgen = state
    app.add_middleware(_Gate, state=state)
    app.add_middleware(TraceContextMiddleware)  # an HTTP request's traceparent parents its engine spans

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
    native.register(app, state)
    return app
