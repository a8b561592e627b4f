"""What every HTTP handler shares: `ServerState` (the engine, the served name, the key, the draining
flag, token text for logprobs) and the engine-call helpers that turn engine errors into OpenAI errors
and cancel work when the client disconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import Request

from radixgen.common.byte_vocab import gpt2_byte_decoder
from radixgen.runtime.server.parsers import ReasoningFormat, ToolCallFormat
from radixgen.runtime.server.protocol import APIError, bad_request, error_from_value_error

T = TypeVar("T")


class ServerState:
    """What every handler shares: the engine, the served name, the key, the draining flag, and the
    output parsers' formats (`--tool-call-parser`, `--reasoning-parser`)."""

    def __init__(self, engine: Any, model_name: str, api_key: str | None, tool_format: ToolCallFormat | None = None,
                 reasoning: ReasoningFormat | None = None) -> None:
        self.engine = engine
        self.tool_format = tool_format  # None: the chat template's own
        self.reasoning = reasoning
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
