"""POST /v1/embeddings (OpenAI) and POST /encode (SGLang's native twin): embeddings of a decoder model.

Each input is a prefill-only engine request (`Engine.async_encode`), batched with everything else; its
embedding is the final norm's output pooled over the prompt and L2-normalized, as SGLang and vLLM
serve decoder models as embedders. Pooling is the server's `--embedding-pooling` (last token by
default, SGLang's and vLLM's choice for decoder models) or the request's `pooling` extension ("last" |
"mean").

- `input`: a string, a list of strings, a list of token ids, or a list of token-id lists (OpenAI's four
  shapes); an empty string or list, or an id outside the vocabulary, is a 400 naming `input`.
- `encoding_format`: "float" (lists of numbers) or "base64" (the little-endian float32 bytes, base64:
  what the official client asks for by default and decodes).
- `dimensions`: these models have one embedding size (no Matryoshka training), so any other value is a
  400, as vLLM answers; the model's own size is accepted.
- `/encode`: `{"text" | "input_ids", "pooling"?}` -> `{"embedding", "meta_info"}` (a list for several).
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from radixgen.runtime.server.protocol import bad_request
from radixgen.runtime.server.state import ServerState, check_finish, engine_call, until_disconnect

MAX_INPUTS = 2048  # inputs per request (OpenAI's limit)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class EmbeddingRequest(_Model):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    pooling: Literal["last", "mean"] | None = None  # radixgen extension (default: --embedding-pooling)


class EncodeRequest(_Model):
    """SGLang's /encode body (radixgen's `pooling` beside it)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    pooling: Literal["last", "mean"] | None = None


class EmbeddingData(_Model):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
    index: int


class EmbeddingUsage(_Model):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(_Model):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def encode_base64(values: list[float]) -> str:
    """OpenAI's base64 encoding: the float32 values as little-endian bytes."""
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def _token_lists(state: ServerState, value: Any, param: str) -> list[list[int]]:
    """The inputs as token-id lists (text tokenized here: call off the event loop), each checked."""
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad_request(f"{param} is empty: give a string, a list of strings or token ids", param)
    if len(value) > MAX_INPUTS:
        raise bad_request(f"{param} has {len(value)} items; at most {MAX_INPUTS} per request", param)
    vocab = state.engine.model_config.vocab_size
    out = []
    for item in value:
        if isinstance(item, str):
            if not item:
                raise bad_request(f"{param} holds an empty string: give at least one character", param)
            ids = state.tokenize(item, param)
        else:
            if not item:
                raise bad_request(f"{param} holds an empty token list", param)
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise bad_request(f"{param} holds {bad}, not a token id in [0, {vocab})", param)
            ids = list(item)
        state.check_context(ids, param)
        out.append(ids)
    return out


async def embed(state: ServerState, request: Request, value: Any, pooling: str | None, param: str) -> list[dict]:
    """The engine's results for the inputs `value` (one per input), admitted like any engine call."""
    ids = await state.offload(_token_lists, state, value, param)
    (hold,) = state.admission.hold_each([len(ids)])
    try:
        outs = await until_disconnect(request, engine_call(state.engine.async_encode(
            input_ids=ids, pooling=pooling or state.options.embedding_pooling)))
    finally:
        hold.release()
    outs = outs if isinstance(outs, list) else [outs]
    for o in outs:
        check_finish(o["meta_info"])
    return outs


def register(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, request: Request) -> Response:
        state.check_model(req.model)
        size = state.engine.model_config.hidden_size
        if req.dimensions is not None and req.dimensions != size:
            raise bad_request(f"this model's embeddings have {size} dimensions and it was not trained to shorten "
                              f"them (Matryoshka): dimensions={req.dimensions} is not supported", "dimensions")
        outs = await embed(state, request, req.input, req.pooling, "input")
        data = [EmbeddingData(index=i, embedding=o["embedding"] if req.encoding_format == "float"
                              else encode_base64(o["embedding"])) for i, o in enumerate(outs)]
        tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
        body = EmbeddingResponse(data=data, model=state.model_name,
                                 usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))
        return JSONResponse(body.model_dump())

    @app.post("/encode")
    async def encode(req: EncodeRequest, request: Request) -> Response:
        if (req.text is None) == (req.input_ids is None):
            raise bad_request("give exactly one of text and input_ids", "text")
        value = req.text if req.text is not None else req.input_ids
        outs = await embed(state, request, value, req.pooling, "text" if req.text is not None else "input_ids")
        single = isinstance(value, str) or (bool(value) and isinstance(value[0], int))
        return JSONResponse(outs[0] if single else outs)
