"""The route guard: every POST body is read, decoded and checked before FastAPI validates it.

`GuardedRoute` (the app's `route_class`) reads the body (413 past the size cap), then
- requires UTF-8 (400 naming the byte offset) and JSON without NaN / Infinity (400 with the position);
  nesting too deep for the parser is a 400 too;
- finds strings the tokenizer and templates cannot take: a lone UTF-16 surrogate (JSON allows
  `"\\ud800"`) is a 400 naming the field (`messages.0.content`);
- applies the per-field limits of limits.py (n, stop, tools, schemas);
- names the client for fair grammar compiles (`user`, else the peer address).
Bodies over `OFFLOAD_BYTES` are parsed and checked on a worker thread, so the event loop stays free.
The parsed body is handed to FastAPI (Starlette's `Request` caches it), so it is not parsed twice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from radixgen.grammar.compiler_cache import compile_client
from radixgen.runtime.server.http_guard import BodyTooLarge, too_large
from radixgen.runtime.server.limits import check_body
from radixgen.runtime.server.options import ServerOptions
from radixgen.runtime.server.protocol import APIError, bad_request

OFFLOAD_BYTES = 64 * 1024
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def find_bad_text(value: Any) -> tuple[str, str] | None:
    """(field path, problem) of the first string (or key) holding a lone surrogate, else None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if not v.isascii() and (m := _SURROGATE.search(v)):
                return path, f"a lone UTF-16 surrogate (\\u{ord(m.group()):04x}) at character {m.start()}"
        elif isinstance(v, dict):
            for k, x in v.items():
                here = f"{path}.{k}" if path else str(k)
                if not k.isascii() and _SURROGATE.search(k):
                    return here, "a key with a lone UTF-16 surrogate"
                stack.append((here, x))
        elif isinstance(v, list):
            stack.extend((f"{path}.{i}" if path else str(i), x) for i, x in enumerate(v))
    return None


def longest_string_bytes(raw: bytes, stop_above: int) -> int:
    """Bytes inside the longest JSON string literal of `raw` (an unterminated one is left to the parser),
    or the first one found longer than `stop_above`. No copy is made, and the loop runs Python bytecode
    between `bytes.find` calls, so it holds the GIL only briefly however large `raw` is."""
    longest = 0
    start = raw.find(b'"')
    while start >= 0:
        end = raw.find(b'"', start + 1)
        while end > 0:  # skip escaped quotes: an odd run of backslashes before them
            back = end - 1
            while raw[back] == 0x5C:
                back -= 1
            if (end - 1 - back) % 2 == 0:
                break
            end = raw.find(b'"', end + 1)
        if end < 0:
            break
        longest = max(longest, end - start - 1)
        if longest > stop_above:
            break
        start = raw.find(b'"', end + 1)
    return longest


def parse_body(raw: bytes, max_string_bytes: int | None = None) -> Any:
    """Decode and parse a JSON body, raising a 400 APIError that says what is wrong and where. A body
    holding a string over `max_string_bytes` (longer than any prompt or schema the server accepts) is
    refused before it is decoded: json.loads holds the GIL while it builds each string, and building
    a 50 MB one stalled every other request for up to a second on a VM whose fresh pages fault slowly."""
    if max_string_bytes is not None and len(raw) > max_string_bytes:
        longest = longest_string_bytes(raw, max_string_bytes)
        if longest > max_string_bytes:
            raise bad_request(f"The request body holds a string of {longest} bytes, longer than any "
                              f"prompt this server accepts (at most {max_string_bytes} bytes of JSON): shorten "
                              "it", None, "context_length_exceeded")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"The request body is not valid UTF-8: {e.reason} at byte {e.start}", None,
                          "invalid_utf8") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise bad_request(f"The request body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                          None, "invalid_json") from None
    except ValueError as e:
        raise bad_request(f"The request body is not valid JSON: {e}", None, "invalid_json") from None
    except RecursionError:
        raise bad_request("The request body is nested too deeply to parse", None, "invalid_json") from None
    bad = find_bad_text(body)
    if bad is not None:
        path, problem = bad
        raise bad_request(f"{path or 'the body'} holds {problem}: send valid Unicode text", path or None,
                          "invalid_text")
    return body


def parse_and_check(raw: bytes, path: str, opts: ServerOptions, max_string_bytes: int | None = None) -> Any:
    """`parse_body`, then the per-field limits of the route at `path`."""
    body = parse_body(raw, max_string_bytes)
    check_body(path, body, opts)
    return body


def _is_json(request: Request) -> bool:
    ctype = request.headers.get("content-type", "application/json").split(";", 1)[0].strip().lower()
    return ctype in ("", "application/json") or ctype.endswith("+json")


class GuardedRoute(APIRoute):
    """An APIRoute whose handler checks the body first (see the module docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        inner = super().get_route_handler()

        async def handler(request: Request) -> Response:
            client = request.client.host if request.client else ""
            if request.method in ("POST", "PUT", "PATCH"):
                body = await _checked_body(request)
                if isinstance(body, dict) and isinstance(body.get("user"), str) and body["user"]:
                    client = "user:" + body["user"][:256]
            compile_client.set(client)
            return await inner(request)

        return handler


async def _read_body(request: Request) -> bytes:
    """The body, as Starlette's `request.body()` reads it, but a large one is joined on a worker thread:
    the event loop would otherwise copy it (50 MB: 10 ms, and up to 0.3 s where fresh pages fault slowly)."""
    chunks = [chunk async for chunk in request.stream()]
    size = sum(map(len, chunks))
    raw = await request.app.state.radixgen.offload(b"".join, chunks) if size > OFFLOAD_BYTES else b"".join(chunks)
    request._body = raw  # Starlette's cache of request.body()
    return raw


async def _checked_body(request: Request) -> Any:
    try:
        raw = await _read_body(request)
    except BodyTooLarge as e:
        raise too_large(e.limit) from None
    except ClientDisconnect:
        raise APIError(499, "client disconnected", "client_closed_request") from None
    if not raw or not _is_json(request):
        return None
    state = request.app.state.radixgen
    check = (parse_and_check, raw, request.url.path, state.options, state.budget.max_string_bytes())
    body = await state.offload(*check) if len(raw) > OFFLOAD_BYTES else parse_and_check(*check[1:])
    request._json = body  # Starlette's cache of request.json(): FastAPI reuses it instead of parsing again
    return body
