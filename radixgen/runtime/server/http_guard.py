"""The outermost ASGI middleware: a request id, the body-size cap, and the catch-all for bugs.

- Request id: the client's `X-Request-Id` (if short and plain) or a fresh one; echoed in the
  response headers and in every server log line about the request (`request_id` context variable).
- Body size: a `Content-Length` over `max_request_bytes` is answered 413 without being stored; a
  chunked body is counted as it arrives and reading it raises `BodyTooLarge` past the cap (the
  route guard turns that into the same 413). The rest of an oversized body is read and dropped
  first (up to `DRAIN_BYTES`): a server that answers and closes while the client is still sending
  resets the connection, and the client never sees the 413.
- Catch-all: an exception no handler answered is logged with the request id and answered with a 500
  in OpenAI's error shape naming that id. If the response had already started (a stream), the body
  is ended cleanly (an SSE stream gets an error event first) instead of leaving the connection hung.
- Memory: after a request with a large body the heap is trimmed (memory.py).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from contextvars import ContextVar
from typing import Any

from radixgen.runtime.server.memory import MemoryTrimmer
from radixgen.runtime.server.protocol import APIError

logger = logging.getLogger("radixgen.server")
request_id: ContextVar[str] = ContextVar("radixgen_request_id", default="-")
_PLAIN_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
DRAIN_BYTES = 256 * 1024 * 1024  # past this an oversized body is cut off (the client sees a reset)


async def drain(receive: Any, more: bool = True) -> None:
    """Read and drop the rest of a request body (at most DRAIN_BYTES)."""
    dropped = 0
    while more and dropped <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return
        dropped += len(message.get("body", b""))
        more = message.get("more_body", False)


class BodyTooLarge(Exception):
    """Raised by `receive` when a request body passes the size cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes")
        self.limit = limit


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server's limit of {limit} bytes "
                         "(--max-request-bytes)", "invalid_request_error", None, "request_too_large")


def internal_error(rid: str) -> APIError:
    return APIError(500, f"The server had an internal error while processing this request (request id {rid}); "
                         "the server log has the details", "server_error", None, "internal_error")


async def send_error(send: Any, err: APIError, headers: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps(err.body()).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class HTTPGuard:
    """Pure-ASGI middleware (see the module docstring); `max_body` is the byte cap."""

    def __init__(self, app: Any, max_body: int) -> None:
        self.app, self.max_body = app, max_body
        self.trimmer = MemoryTrimmer()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        rid = given if _PLAIN_ID.fullmatch(given) else uuid.uuid4().hex
        token = request_id.set(rid)
        id_header = [(b"x-request-id", rid.encode())]
        length = headers.get(b"content-length", b"").strip()
        if length and (not length.isdigit() or int(length) > self.max_body):
            err = too_large(self.max_body) if length.isdigit() else APIError(
                400, "Content-Length is not a number", "invalid_request_error", None, "invalid_request")
            if length.isdigit():
                await drain(receive)
            await send_error(send, err, [*id_header, (b"connection", b"close")])
            request_id.reset(token)
            return
        received = 0
        started = False
        sse = False
        limit = self.max_body

        async def guarded_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    await drain(receive, message.get("more_body", False))
                    raise BodyTooLarge(limit)
            return message

        async def tagged_send(message: dict) -> None:
            nonlocal started, sse
            if message["type"] == "http.response.start":
                started = True
                sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                          for k, v in message.get("headers", ()))
                message = dict(message, headers=[*message.get("headers", ()), *id_header])
            await send(message)

        try:
            await self.app(scope, guarded_receive, tagged_send)
        except Exception:
            logger.exception("request %s %s failed (request id %s)", scope.get("method"), scope.get("path"), rid)
            await self._answer_bug(send, rid, started, sse, id_header)
        finally:
            request_id.reset(token)
            self.trimmer.after_request(received)

    async def _answer_bug(self, send: Any, rid: str, started: bool, sse: bool, id_header: list) -> None:
        err = internal_error(rid)
        try:
            if not started:
                await send_error(send, err, id_header)
                return
            tail = b"data: " + json.dumps(err.body()).encode() + b"\n\n" if sse else b""
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        except Exception:  # the client is gone, or the response was already complete
            pass
