"""API-key check and the draining gate, as pure-ASGI middleware (cheaper than BaseHTTPMiddleware).

- The key comes from `radixgen serve --api-key K` or, so that it does not show in `ps`, the
  `RADIXGEN_API_KEY` environment variable. Clients send `Authorization: Bearer K` (or `X-API-Key: K`).
- Every route needs it except /health, and /metrics with `--public-metrics` (for a scraper that
  holds no key). The comparison is constant-time (`hmac.compare_digest` over SHA-256 digests, so
  neither the content nor the length of the key leaks through timing).
- While the server drains for shutdown every request gets 503.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from radixgen.runtime.server.http_guard import send_error
from radixgen.runtime.server.protocol import APIError

OPEN_PATHS = frozenset({"/health"})  # reachable without the API key


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass") if isinstance(key, str) else key).digest()


class KeyCheck:
    """Whether a request's headers carry the API key (constant-time)."""

    def __init__(self, api_key: str | None) -> None:
        self._digest = _digest(api_key) if api_key else None

    @property
    def enabled(self) -> bool:
        return self._digest is not None

    def accepts(self, headers: dict[bytes, bytes]) -> bool:
        if self._digest is None:
            return True
        return hmac.compare_digest(_digest(presented_key(headers)), self._digest)


def presented_key(headers: dict[bytes, bytes]) -> bytes:
    """The key a request's headers carry (`Authorization: Bearer K`, else `X-API-Key: K`); b"" if none."""
    auth = headers.get(b"authorization", b"")
    return auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"").strip()


class Gate:
    """503 while draining, 401 without the key (see the module docstring)."""

    def __init__(self, app: Any, state: Any, api_key: str | None, public_metrics: bool = False) -> None:
        self.app, self.state = app, state
        self.keys = KeyCheck(api_key)
        self.open_paths = OPEN_PATHS | ({"/metrics"} if public_metrics else set())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            err = self._check(scope)
            if err is not None:
                await send_error(send, err, [])
                return
        await self.app(scope, receive, send)

    def _check(self, scope: dict) -> APIError | None:
        if self.state.draining:
            return APIError(503, "the server is shutting down", "server_unavailable", None, "shutting_down")
        if scope["path"] not in self.open_paths and not self.keys.accepts(dict(scope["headers"])):
            return APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                            "invalid_request_error", None, "invalid_api_key")
        return None
