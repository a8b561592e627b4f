"""The router's HTTP app: the serving API of a `radixgen serve`, proxied to replicas chosen by policy.

- POST /generate, /v1/completions, /v1/chat/completions: routed by the prompt's text (the chat
  messages' roles and contents in order; ids for requests given as ids) through the policy; the body
  and the Authorization header go through untouched, the answer (or its Server-Sent Events) comes
  back with an `X-Radixgen-Worker` header naming the replica.
- POST /tokenize, /detokenize; GET /v1/models[/{id}], /get_model_info: the least loaded replica.
- POST /flush_cache: every replica in rotation (success if all flushed), and the prefix trees.
- GET /health: 200 while a replica is in rotation, else 503; GET /workers: each replica's state;
  GET /metrics: the router's Prometheus metrics (`metrics.py`).

Failures: a request that cannot connect to its replica never started there, so it is routed again
(the replica leaves rotation); so are requests queued in the router for a replica that leaves. A
request in flight on a replica that fails ends with a clear error (502 in OpenAI's error shape, or an
error event in a stream), never a hang: it races its I/O against the replica leaving rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from radixgen.runtime.router import metrics
from radixgen.runtime.router.config import RouterConfig
from radixgen.runtime.router.prefix_tree import Key
from radixgen.runtime.router.workers import NoWorkerError, Worker, WorkerPool
from radixgen.runtime.server.protocol import APIError

T = TypeVar("T")
ROUTED = ("/generate", "/v1/completions", "/v1/chat/completions")
FORWARDED_HEADERS = ("authorization", "x-api-key", "content-type", "accept")
WORKER_HEADER = "X-Radixgen-Worker"


class WorkerGone(Exception):
    """The replica left rotation while this request was in flight on it."""


def routing_key(path: str, body: Any) -> Key:
    """What the policy matches prefixes on: the prompt text, or a tuple of ids; "" if there is none."""
    if not isinstance(body, dict):
        return ""
    if path == "/v1/chat/completions":
        parts = []
        for m in body.get("messages") or []:
            if isinstance(m, dict):
                content = m.get("content")
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                parts.append(f"{m.get('role', '')}\n{content or ''}\n")
        return "".join(parts)
    prompt = body.get("prompt") if path == "/v1/completions" else (body.get("text") or body.get("input_ids"))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch goes where its first prompt goes
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return tuple(prompt)
    return ""


def _error(status: int, message: str, code: str, type_: str = "server_error") -> JSONResponse:
    return JSONResponse(APIError(status, message, type_, None, code).body(), status_code=status)


async def _or_gone(aw: Awaitable[T], w: Worker) -> T:
    """`await aw`, unless `w` leaves rotation first (then cancel it and raise WorkerGone)."""
    task = asyncio.ensure_future(aw)
    gone = asyncio.ensure_future(w.dead.wait())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise WorkerGone(w.reason or "left rotation")


class Router:
    """The app's state: the replicas, the HTTP client to them, the health-check task."""

    def __init__(self, urls: list[str], config: RouterConfig) -> None:
        self.pool = WorkerPool(urls, config)
        self.client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task] = set()

    def _headers(self, request: Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}

    def _probe(self, w: Worker) -> None:
        """Check `w` now (after a request to it failed), in the background."""
        task = asyncio.ensure_future(self.pool.check(self.client, w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _failed(self, w: Worker, e: BaseException) -> JSONResponse:
        self.pool.errors["worker_failed"] += 1
        self._probe(w)
        return _error(502, f"replica {w.url} failed while serving this request ({type(e).__name__}: {e}); it had "
                           f"started there, so it was not retried: send it again", "worker_failed")

    async def route(self, request: Request, path: str) -> Response:
        body = await request.body()
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None  # the replica answers the 400
        key = routing_key(path, parsed)
        stream = isinstance(parsed, dict) and bool(parsed.get("stream"))
        headers = self._headers(request)
        while True:
            try:
                w, _ = await self.pool.acquire(key)
            except NoWorkerError as e:
                self.pool.errors["no_worker"] += 1
                return _error(503, str(e), "no_worker", "server_unavailable")
            req = self.client.build_request("POST", w.url + path, content=body, headers=headers)
            try:
                resp = await _or_gone(self.client.send(req, stream=stream), w)
            except httpx.ConnectError as e:  # it never reached the replica: route it again
                self.pool.release(w)
                self.pool.leave(w, f"connection refused ({e})")
                self.pool.rerouted += 1
                continue
            except (httpx.HTTPError, WorkerGone) as e:
                self.pool.release(w)
                return self._failed(w, e)
            out_headers = {"content-type": resp.headers.get("content-type", "application/json"), WORKER_HEADER: w.url}
            if stream and resp.status_code == 200:
                return StreamingResponse(self._relay(resp, w), headers=out_headers)
            try:
                content = await _or_gone(resp.aread(), w) if stream else resp.content
            except (httpx.HTTPError, WorkerGone) as e:
                return self._failed(w, e)
            finally:
                if stream:
                    await resp.aclose()
                self.pool.release(w)
            return Response(content, status_code=resp.status_code, headers=out_headers)

    async def _relay(self, resp: httpx.Response, w: Worker) -> AsyncIterator[bytes]:
        chunks = resp.aiter_raw()

        async def next_chunk() -> bytes | None:
            try:
                return await chunks.__anext__()
            except StopAsyncIteration:
                return None

        try:
            while (chunk := await _or_gone(next_chunk(), w)) is not None:
                yield chunk
        except (httpx.HTTPError, WorkerGone) as e:
            body = json.loads(self._failed(w, e).body)
            yield b"data: " + json.dumps(body).encode() + b"\n\n"
        finally:
            await resp.aclose()
            self.pool.release(w)

    async def any_worker(self, request: Request, method: str, path: str) -> Response:
        """Forward to the least loaded replica (routes that need no affinity)."""
        try:
            w = self.pool.least_loaded()
        except NoWorkerError as e:
            return _error(503, str(e), "no_worker", "server_unavailable")
        try:
            r = await self.client.request(method, w.url + path, content=await request.body(),
                                          headers=self._headers(request), params=request.query_params)
        except httpx.HTTPError as e:
            return self._failed(w, e)
        content_type = r.headers.get("content-type", "application/json")
        return Response(r.content, status_code=r.status_code,
                        headers={"content-type": content_type, WORKER_HEADER: w.url})

    async def flush_cache(self, request: Request) -> Response:
        live = self.pool.healthy()
        results = await asyncio.gather(*(self.client.post(w.url + "/flush_cache", headers=self._headers(request))
                                         for w in live), return_exceptions=True)
        ok = bool(live) and all(isinstance(r, httpx.Response) and r.status_code == 200 and r.json().get("success")
                                for r in results)
        if ok:
            self.pool.policy.clear()
        return JSONResponse({"success": ok, "message": "every replica flushed its cache" if ok else
                             "some replica did not flush (requests in flight, or it failed): retry when idle"})

    def workers(self) -> list[dict]:
        trees = getattr(self.pool.policy, "trees", {})
        return [{"url": w.url, "healthy": w.healthy, "reason": w.reason, "in_flight": w.in_flight,
                 "queued": len(w.queue), "tree_size": trees[w.url].size if w.url in trees else 0,
                 "routed": dict(w.routed)} for w in self.pool.workers]


def create_router_app(urls: list[str], config: RouterConfig | None = None) -> FastAPI:
    """A FastAPI app routing the serving API over the replicas at `urls`."""
    router = Router(urls, config or RouterConfig())
    registry = metrics.registry(router.pool)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        router.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits)
        watch = asyncio.ensure_future(router.pool.watch(router.client))
        try:
            yield
        finally:
            watch.cancel()
            await router.client.aclose()

    app = FastAPI(title="radixgen router", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.router = router

    for path in ROUTED:
        async def routed(request: Request, _path: str = path) -> Response:
            return await router.route(request, _path)

        app.add_api_route(path, routed, methods=["POST"])
    for path in ("/tokenize", "/detokenize"):
        async def post_any(request: Request, _path: str = path) -> Response:
            return await router.any_worker(request, "POST", _path)

        app.add_api_route(path, post_any, methods=["POST"])

    @app.get("/v1/models")
    @app.get("/v1/models/{model_id:path}")
    @app.get("/get_model_info")
    async def get_any(request: Request) -> Response:
        return await router.any_worker(request, "GET", request.url.path)

    @app.post("/flush_cache")
    async def flush_cache(request: Request) -> Response:
        return await router.flush_cache(request)

    @app.get("/health")
    async def health() -> Response:
        n = len(router.pool.healthy())
        if n == 0:
            return _error(503, router.pool.no_worker_message(), "no_worker", "server_unavailable")
        return JSONResponse({"status": "ok", "workers_in_rotation": n})

    @app.get("/workers")
    async def workers() -> Response:
        return JSONResponse(router.workers())

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
