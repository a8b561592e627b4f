"""Server-Sent Events: framing (`sse`, `SSE_DONE`), a response that always closes its body iterator
(`SSEResponse`), and `merge_streams`, which interleaves several engine streams as their chunks arrive.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse


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
