"""POST /v1/completions: OpenAI's legacy completions over the engine, streamed or not.

`prompt` is a string, a list of strings, a list of token ids or a list of such lists; each prompt
gives `n` choices, indexed prompt-major (choice `p * n + k`). `echo` prepends the prompt text;
`logprobs: N` returns the legacy `{tokens, token_logprobs, top_logprobs (N per token), text_offset}`
(with `echo`, the prompt's tokens too: its first token has no logprob). `max_tokens` defaults to 16
as in OpenAI's API. `suffix` is not supported; `best_of` must equal `n`. The radixgen extensions
(`top_k`, `min_p`, `regex`, `json_schema`, `ebnf`, ...) ride in the body as for chat.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixgen.runtime.server.app import SSE_DONE, ServerState, SSEResponse, abort_error, merge_streams, sse
from radixgen.runtime.server.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
    bad_request,
    new_id,
    now,
)


def register(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        return await create_completion(state, req, request)


def prompts_of(state: ServerState, prompt: object) -> list[tuple[list[int], str]]:
    """(token ids, text) per prompt, each checked against the prompt limit (blocking: offload it)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad_request("prompt must be a non-empty string, list of strings or list of token ids", "prompt")
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    out = []
    for p in prompt:
        if isinstance(p, str):
            if not p:
                raise bad_request("prompt is empty: give at least one character of text", "prompt")
            out.append((state.tokenize(p, "prompt"), p))
        else:
            if not p:
                raise bad_request("prompt is an empty token list", "prompt")
            vocab = getattr(state.tokenizer, "vocab_size", None)
            bad = [t for t in p if t < 0 or (vocab is not None and t >= vocab)]
            if bad:
                raise bad_request(f"prompt holds {bad[0]}, not a token id in [0, {vocab})", "prompt")
            state.check_context(p, "prompt")
            out.append((list(p), state.tokenizer.decode(list(p), skip_special_tokens=False)))
    return out


def _lp(x: object) -> float | None:
    return None if x is None else max(float(x), -9999.0)


class LegacyLogprobs:
    """Accumulates the legacy logprobs object of one choice (token pieces, offsets, top-N dicts)."""

    def __init__(self, state: ServerState, offset: int, top_n: int) -> None:
        self.state, self.offset, self.top_n = state, offset, top_n

    def build(self, entries: list, tops: list | None) -> CompletionLogprobs:
        out = CompletionLogprobs(top_logprobs=[] if self.top_n else None)
        for j, (lp, tid) in enumerate(entries):
            text, _ = self.state.piece(tid)
            out.tokens.append(text)
            out.token_logprobs.append(_lp(lp))
            out.text_offset.append(self.offset)
            self.offset += len(text)
            if self.top_n:
                row = tops[j] if tops is not None and j < len(tops) else None
                out.top_logprobs.append(None if row is None else
                                        {self.state.piece(t)[0]: _lp(v) for v, t in row[: self.top_n]})
        return out


def _finish(fr: dict | None) -> str | None:
    return None if fr is None else ("length" if fr["type"] == "length" else "stop")


async def create_completion(state: ServerState, req: CompletionRequest, request: Request) -> Response:
    state.check_model(req.model)
    if req.suffix:
        raise bad_request("suffix is not supported", "suffix")
    if req.best_of not in (None, req.n):
        raise bad_request("best_of is not supported (it must equal n)", "best_of")
    prompts = await state.offload(prompts_of, state, req.prompt)  # tokenizing runs off the event loop
    sp = await state.offload(req.sampling_params, req.max_tokens, 16)
    top_n = req.logprobs or 0
    if not 0 <= top_n <= 20:
        raise bad_request(f"logprobs must be in [0, 20], got {req.logprobs}", "logprobs")
    want_lp = req.logprobs is not None
    kw = dict(return_logprob=want_lp, top_logprobs_num=top_n, logprob_start_len=0 if req.echo and want_lp else -1)
    n = req.n
    if req.stream:
        return await _stream(state, req, request, prompts, sp, kw)
    out = await state.generate(request, req.constraint_param(), input_ids=[ids for ids, _ in prompts],
                               sampling_params=dict(sp, n=n), **kw)
    outs = out if isinstance(out, list) else [out]
    choices = []
    for idx, o in enumerate(outs):
        ids, text = prompts[idx // n]
        meta = o["meta_info"]
        fr = meta["finish_reason"]
        logprobs = None
        if want_lp:
            acc = LegacyLogprobs(state, 0 if req.echo else len(text), top_n)
            entries = list(meta.get("output_token_logprobs", []))
            tops = list(meta.get("output_top_logprobs") or []) if top_n else None
            if req.echo:
                entries = list(meta.get("input_token_logprobs", [])) + entries
                if top_n:
                    tops = list(meta.get("input_top_logprobs") or [None] * len(ids)) + tops
            logprobs = acc.build(entries, tops)
        choices.append(CompletionChoice(index=idx, text=(text if req.echo else "") + o["text"], logprobs=logprobs,
                                        finish_reason=_finish(fr), matched_stop=fr.get("matched") if fr else None))
    metas = [o["meta_info"] for o in outs]
    usage = Usage.of(sum(len(ids) for ids, _ in prompts), sum(m["completion_tokens"] for m in metas),
                     sum(m["cached_tokens"] for m in metas[::n]))
    resp = CompletionResponse(id=new_id("cmpl"), created=now(), model=state.model_name, choices=choices, usage=usage)
    return JSONResponse(resp.model_dump(exclude_none=True))


async def _stream(state: ServerState, req: CompletionRequest, request: Request, prompts: list, sp: dict,
                  kw: dict) -> Response:
    n = req.n
    if n > 1:
        for ids, _ in prompts:
            await state.precache(ids)
    seqs = [(ids, text) for ids, text in prompts for _ in range(n)]
    kws = []
    for idx, (ids, _) in enumerate(seqs):
        k = idx % n
        p = dict(sp, seed=sp["seed"] + k) if n > 1 and sp.get("seed") is not None else sp
        kws.append(dict(kw, input_ids=ids, sampling_params=p))
    streams = await state.open_streams(request, kws, req.constraint_param())
    cid, created, model = new_id("cmpl"), now(), state.model_name
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    want_lp = req.logprobs is not None
    top_n = req.logprobs or 0

    def chunk(i: int, text: str, finish: str | None = None, logprobs: CompletionLogprobs | None = None) -> bytes:
        return sse(CompletionResponse(id=cid, created=created, model=model, choices=[
            CompletionChoice(index=i, text=text, logprobs=logprobs, finish_reason=finish)]))

    async def events() -> AsyncIterator[bytes]:
        accs = [LegacyLogprobs(state, 0 if req.echo else len(t), top_n) for _, t in seqs]
        seen = [0] * len(seqs)
        started = [False] * len(seqs)
        metas: list[dict | None] = [None] * len(seqs)
        async for i, c in merge_streams(streams):
            meta = c["meta_info"]
            fr = meta["finish_reason"]
            if fr is not None and fr["type"] == "abort":
                yield sse(abort_error(fr).body())
                return
            text, logprobs = c["text"], None
            new = len(c["output_ids"])
            if want_lp:
                entries = list(meta["output_token_logprobs"][seen[i]:seen[i] + new])
                tops_all = meta.get("output_top_logprobs")
                tops = list(tops_all[seen[i]:seen[i] + new]) if top_n and tops_all is not None else None
                if req.echo and not started[i]:
                    entries = list(meta.get("input_token_logprobs", [])) + entries
                    if top_n:
                        tops = list(meta.get("input_top_logprobs") or [None] * len(seqs[i][0])) + (tops or [])
                logprobs = accs[i].build(entries, tops)
            seen[i] += new
            if req.echo and not started[i]:
                text = seqs[i][1] + text
            started[i] = True
            if text or logprobs is not None or fr is not None:
                yield chunk(i, text, _finish(fr), logprobs)
            if fr is not None:
                metas[i] = meta
        if include_usage and all(metas):
            usage = Usage.of(sum(len(ids) for ids, _ in prompts), sum(m["completion_tokens"] for m in metas),
                             sum(m["cached_tokens"] for m in metas[::n]))
            yield sse(CompletionResponse(id=cid, created=created, model=model, choices=[], usage=usage))
        yield SSE_DONE

    return SSEResponse(events())
