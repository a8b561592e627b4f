"""SGLang's native HTTP protocol on `radixgen serve`, so SGLang's own client drives it unchanged.

Checked field by field against the client in the sglang wheel (`sglang/lang/backend/runtime_endpoint.py`
and `sglang/utils.py`, versions 0.5.10 to 0.5.23) and the server it talks to:

- POST /generate: `text` (str or list) or `input_ids`, `sampling_params` (a dict or one per prompt),
  `return_logprob`, `logprob_start_len`, `top_logprobs_num`, `return_text_in_logprobs`, `stream`,
  `rid`, plus radixgen's `extra_key`. In `sampling_params` the client always sends
  `skip_special_tokens`, `spaces_between_special_tokens` and `stop_regex` (usually `[]`) next to the
  engine's fields; fields set to null mean "default" as in SGLang. Honoured beyond the engine's own:
  `stop_regex` (the output is cut after the first match, finish_reason `{"type": "stop", "matched":
  <pattern>}`; one prompt with n=1), `no_stop_trim` (a matched stop string stays in the text) and
  `sampling_seed` (the engine's `seed`). Ignored as harmless: `spaces_between_special_tokens` (HF
  fast tokenizers never insert such spaces) and `stream_interval` (every chunk is sent).
  `image_data` is refused (text-only models).
  Answer: `{"text", "output_ids", "meta_info"}` (a list for several prompts or n > 1); logprob entries
  are SGLang's `[logprob, token_id, token_text]` (text null unless `return_text_in_logprobs`).
  Streaming: SSE events whose `text` and `output_ids` are CUMULATIVE (SGLang's default), then
  `data: [DONE]`.
- GET /get_model_info (and /model_info): `model_path` (what the server was started with, or the
  default model's file), `tokenizer_path`, `is_generation`, `served_model_name`, plus what radixgen's
  RuntimeEndpoint renders roles with: the chat template text and the special tokens.
- GET /get_server_info (and /server_info): the engine configuration, `version`, and the live
  statistics in `internal_states`.
- POST /concate_and_append_request `{"src_rids", "dst_rid"}`: what the client posts for
  `join(mode="concate_and_append")`. The client has already appended the branches' texts to the
  parent; SGLang's server spliced the branches' KV (computed at other positions) onto it. radixgen
  acknowledges it and computes nothing: the parent's next /generate finds the shared prefix in the
  radix cache and prefills the appended text exactly.
- GET|POST /flush_cache: 200 when flushed, 400 while requests are in flight (SGLang's statuses).
- POST /abort_request `{"rid"}`; GET /health_generate (a one-token generation);
  POST /tokenize, POST /detokenize (radixgen's, used by its RuntimeEndpoint).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixgen.common.stop_regex import StopRegex
from radixgen.runtime.observability import exposition
from radixgen.runtime.server.protocol import (
    APIError,
    ConcateAndAppendRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
    bad_request,
)
from radixgen.runtime.server.state import ServerState, engine_call, until_disconnect
from radixgen.runtime.server.streams import SSE_DONE, SSEResponse, merge_streams, sse
from radixgen.sampling.params import SamplingParams

IGNORED_SAMPLING_FIELDS = ("spaces_between_special_tokens", "stream_interval")
ENGINE_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
NATIVE_SAMPLING_FIELDS = {"stop_regex", "no_stop_trim", "sampling_seed", *IGNORED_SAMPLING_FIELDS}
LOGPROB_KEYS = ("input_token_logprobs", "output_token_logprobs")
TOP_LOGPROB_KEYS = ("input_top_logprobs", "output_top_logprobs")


@dataclasses.dataclass
class NativeOptions:
    """What the native layer applies on top of the engine for one request."""

    stop_regex: StopRegex | None = None
    no_stop_trim: bool = False


def engine_sampling_params(sp: Any, param: str = "sampling_params") -> tuple[Any, NativeOptions]:
    """SGLang's sampling_params (a dict or None) -> the engine's dict and the native-only options."""
    if sp is None:
        return None, NativeOptions()
    if not isinstance(sp, dict):
        raise bad_request(f"{param} must be an object", param)
    out = {k: v for k, v in sp.items() if v is not None and k not in IGNORED_SAMPLING_FIELDS}
    try:
        stop = StopRegex.from_param(out.pop("stop_regex", None))
    except ValueError as e:
        raise bad_request(str(e), f"{param}.stop_regex") from None
    no_stop_trim = out.pop("no_stop_trim", False)
    if not isinstance(no_stop_trim, bool):
        raise bad_request(f"no_stop_trim must be a bool, got {no_stop_trim!r}", f"{param}.no_stop_trim")
    if "sampling_seed" in out:
        out["seed"] = out.pop("sampling_seed")
    unknown = sorted(set(out) - ENGINE_SAMPLING_FIELDS)
    if unknown:
        raise bad_request(f"sampling parameter {unknown[0]!r} is not supported by radixgen; supported: "
                          f"{', '.join(sorted(ENGINE_SAMPLING_FIELDS | NATIVE_SAMPLING_FIELDS))}",
                          f"{param}.{unknown[0]}")
    return out, NativeOptions(stop, no_stop_trim)


def _convert(req: GenerateRequest) -> tuple[dict, list[NativeOptions]]:
    """The engine call's keyword arguments and the per-prompt native options."""
    if req.image_data is not None:
        raise bad_request("image_data: radixgen serves text-only models; send text or input_ids", "image_data")
    if isinstance(req.sampling_params, list):
        pairs = [engine_sampling_params(sp, f"sampling_params[{i}]") for i, sp in enumerate(req.sampling_params)]
        sampling: Any = [p for p, _ in pairs]
        options = [o for _, o in pairs]
    else:
        sampling, opt = engine_sampling_params(req.sampling_params)
        options = [opt]
    kw = dict(prompt=req.text, input_ids=req.input_ids, sampling_params=sampling, return_logprob=req.return_logprob,
              logprob_start_len=req.logprob_start_len, top_logprobs_num=req.top_logprobs_num,
              extra_key=req.extra_key, rid=req.rid)
    return kw, options


def _per_output(options: list[NativeOptions], sampling: Any) -> list[NativeOptions]:
    """The options of each engine output (a prompt with n > 1 gives n outputs)."""
    if len(options) == 1:
        return options
    return [o for o, sp in zip(options, sampling, strict=True) for _ in range((sp or {}).get("n", 1))]


def _is_single(req: GenerateRequest) -> bool:
    return isinstance(req.text, str) or (bool(req.input_ids) and isinstance(req.input_ids[0], int))


def model_path(engine: Any) -> str:
    """What the server was started with (`--model`), else the default model's file."""
    from radixgen.runtime.models.resolve import resolve_model_path

    model = getattr(getattr(engine, "config", None), "model", None)
    return str(model) if model else str(resolve_model_path(None))


class _Format:
    """Engine results -> SGLang's shapes (logprob entries with token text, untrimmed stops)."""

    def __init__(self, token_text: Any, with_text: bool, options: list[NativeOptions]) -> None:
        self.token_text, self.with_text, self.options = token_text, with_text, options

    def entry(self, e: Any) -> list:
        return [e[0], e[1], self.token_text(e[1]) if self.with_text else None]

    def meta(self, meta: dict) -> dict:
        meta = dict(meta)
        for key in LOGPROB_KEYS:
            if key in meta:
                meta[key] = [self.entry(e) for e in list(meta[key])]
        for key in TOP_LOGPROB_KEYS:
            if key in meta:
                meta[key] = [None if row is None else [self.entry(e) for e in row] for row in list(meta[key])]
        return meta

    def result(self, out: dict, i: int = 0) -> dict:
        opt = self.options[i if len(self.options) > 1 else 0]
        text, meta = out["text"], self.meta(out["meta_info"])
        matched = (meta.get("finish_reason") or {}).get("matched")
        if opt.no_stop_trim and isinstance(matched, str) and opt.stop_regex is None:
            text += matched
        return {"text": text, "output_ids": list(out["output_ids"]), "meta_info": meta}


async def _cumulative(first: dict, it: AsyncIterator[dict], fmt: _Format, stop: StopRegex | None
                      ) -> AsyncIterator[dict]:
    """The engine's delta chunks as SGLang's cumulative ones; a stop_regex match ends the stream
    (closing the engine iterator aborts the request)."""
    text, ids = "", []
    try:
        async for _, chunk in merge_streams([(first, it)]):
            text += chunk["text"]
            ids += chunk["output_ids"]
            out = fmt.result({"text": text, "output_ids": ids, "meta_info": chunk["meta_info"]})
            match = stop.match(text) if stop is not None else None
            if match is not None:
                out["text"] = text[: match.end]
                out["meta_info"]["finish_reason"] = {"type": "stop", "matched": match.pattern}
                yield out
                return
            yield out
    finally:
        await it.aclose()


def register(app: FastAPI, state: ServerState) -> None:
    """Add the native routes to `app`."""
    engine = state.engine
    served_path = model_path(engine)
    token_text = functools.lru_cache(maxsize=65536)(
        lambda tid: state.tokenizer.decode([tid], skip_special_tokens=False))

    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request) -> Response:
        kw, options = _convert(req)
        stop = options[0].stop_regex
        if any(o.stop_regex is not None for o in options):
            sp = kw["sampling_params"]
            if len(options) > 1 or not _is_single(req) or (sp or {}).get("n", 1) != 1:
                raise bad_request("stop_regex takes one prompt with n=1", "sampling_params.stop_regex")
        if not req.stream and stop is None:
            out = await until_disconnect(request, engine_call(engine.async_generate(**kw), "sampling_params"))
            if isinstance(out, list):
                fmt = _Format(token_text, req.return_text_in_logprobs, _per_output(options, kw["sampling_params"]))
                return JSONResponse([fmt.result(o, i) for i, o in enumerate(out)])
            return JSONResponse(_Format(token_text, req.return_text_in_logprobs, options).result(out))
        fmt = _Format(token_text, req.return_text_in_logprobs, options)
        ((first, it),) = await state.open_streams(request, [kw], "sampling_params")
        chunks = _cumulative(first, it, fmt, stop)
        if not req.stream:
            last: dict = {}
            async for chunk in chunks:
                last = chunk
            return JSONResponse(last)

        async def events() -> AsyncIterator[bytes]:
            async for chunk in chunks:
                yield sse(chunk)
            yield SSE_DONE

        return SSEResponse(events())

    async def model_info() -> Response:
        tok = state.tokenizer
        hf = getattr(tok, "hf", None)
        return JSONResponse({
            "model_path": served_path, "tokenizer_path": served_path, "is_generation": True,
            "served_model_name": state.model_name, "model_name": state.model_name,
            "preferred_sampling_params": None, "weight_version": None,
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": getattr(getattr(engine, "model_config", None), "arch", None),
            "context_length": engine.context_length,
            "vocab_size": getattr(tok, "vocab_size", None),
            "chat_template": getattr(tok, "chat_template", None),
            "special_tokens_map": dict(getattr(hf, "special_tokens_map", {}) or {}),
            "bos_token_id": getattr(hf, "bos_token_id", None),
            "eos_token_ids": list(tok.eos_token_ids),
            "all_special_ids": list(getattr(hf, "all_special_ids", []) or []),
        })

    async def server_info() -> Response:
        from radixgen import __version__

        stats = exposition.stats_json(await asyncio.to_thread(engine.get_stats))
        config = getattr(engine, "config", None)
        info = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
        return JSONResponse({
            **info, "model_path": served_path, "served_model_name": state.model_name,
            "max_total_num_tokens": info.get("max_total_tokens"), "context_length": engine.context_length,
            "version": __version__, "internal_states": [stats],
        })

    for route in ("/get_model_info", "/model_info"):
        app.add_api_route(route, model_info, methods=["GET"])
    for route in ("/get_server_info", "/server_info"):
        app.add_api_route(route, server_info, methods=["GET"])

    @app.post("/concate_and_append_request")
    async def concate_and_append(req: ConcateAndAppendRequest) -> Response:
        return JSONResponse({"success": True, "message": "acknowledged: the joined text is prefilled by the "
                                                         "parent's next request over the cached prefix"})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if await asyncio.to_thread(engine.flush_cache):
            return JSONResponse({"success": True, "message": "cache flushed"})
        raise APIError(400, "requests are in flight; the cache was not flushed (retry when idle)",
                       "invalid_request_error", None, "cache_busy")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await request.json()
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str) or not rid:
            raise bad_request("rid: give the id of the request to abort", "rid")
        engine.abort(rid)
        return JSONResponse({"success": True})

    @app.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        await until_disconnect(request, engine_call(engine.async_generate(
            input_ids=[state.tokenizer.eos_token_ids[0]], sampling_params={"max_new_tokens": 1, "temperature": 0})))
        return JSONResponse({"status": "ok"})

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> Response:
        texts = [req.text] if isinstance(req.text, str) else req.text
        ids = [state.tokenizer.encode(t, add_special_tokens=req.add_special_tokens) for t in texts]
        return JSONResponse({"tokens": ids[0] if isinstance(req.text, str) else ids})

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> Response:
        return JSONResponse({"text": state.tokenizer.decode(req.tokens, skip_special_tokens=req.skip_special_tokens)})
