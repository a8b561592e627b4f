"""POST /v1/completions: OpenAI's legacy completions over the engine, streamed or not.

`prompt` is a string, a list of strings, a list of token ids or a list of such lists; each prompt
gives `n` choices, indexed prompt-major (choice `p * n + k`). `echo` prepends the prompt text;
`logprobs: N` returns the legacy `{tokens, token_logprobs, top_logprobs (N per token), text_offset}`
(with `echo`, the prompt's tokens too: its first token has no logprob). `max_tokens` defaults to 16
as in OpenAI's API. `suffix` is not supported; `best_of` must equal `n`. The radixgen extensions
(`top_k`, `min_p`, `regex`, `json_schema`, `ebnf`, ...) ride in the body as for chat. Streamed or not,
the answer goes through serving.py's one code path: the non-streamed choice is its deltas folded.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

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
from radixgen.runtime.server.serving import Output, Plan, TokenLogprobs, expand, respond
from radixgen.runtime.server.state import ServerState


def register(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        return await create_completion(state, req, request)


def prompts_of(state: ServerState, prompt: object) -> list[tuple[list[int], str]]:
    """(token ids, text) per prompt."""
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
            out.append((state.tokenizer.encode(p), p))
        else:
            if not p:
                raise bad_request("prompt is an empty token list", "prompt")
            vocab = getattr(state.tokenizer, "vocab_size", None)
            bad = [t for t in p if t < 0 or (vocab is not None and t >= vocab)]
            if bad:
                raise bad_request(f"prompt holds {bad[0]}, not a token id in [0, {vocab})", "prompt")
            out.append((list(p), state.tokenizer.decode(list(p), skip_special_tokens=False)))
    for ids, _ in out:
        state.check_context(ids, "prompt")
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


class CompletionOutput(Output):
    """Engine chunks of each choice -> legacy completion deltas -> chunks or one response."""

    def __init__(self, state: ServerState, req: CompletionRequest, prompts: list[tuple[list[int], str]]) -> None:
        self.state, self.echo, self.n = state, req.echo, req.n
        self.want_lp, self.top_n = req.logprobs is not None, req.logprobs or 0
        self.prompts = [prompts[i // req.n] for i in range(len(prompts) * req.n)]  # per choice
        self.accs = [LegacyLogprobs(state, 0 if req.echo else len(text), self.top_n) for _, text in self.prompts]
        self.started = [False] * len(self.prompts)
        self.id, self.created, self.model = new_id("cmpl"), now(), state.model_name

    def step(self, index: int, chunk: dict, logprobs: TokenLogprobs | None) -> list[CompletionChoice]:
        meta, text = chunk["meta_info"], chunk["text"]
        first, self.started[index] = not self.started[index], True
        lp = None
        if self.want_lp:
            assert logprobs is not None
            entries = list(logprobs.entries)
            tops = list(logprobs.tops or []) if self.top_n else None
            if self.echo and first:
                entries = list(meta.get("input_token_logprobs", [])) + entries
                if tops is not None:
                    ids = self.prompts[index][0]
                    tops = list(meta.get("input_top_logprobs") or [None] * len(ids)) + tops
            lp = self.accs[index].build(entries, tops)
        if self.echo and first:
            text = self.prompts[index][1] + text
        fr = meta["finish_reason"]
        if not text and lp is None and fr is None:
            return []
        return [CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=_finish(fr))]

    def chunk(self, deltas: list[CompletionChoice], usage: Usage | None = None) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=deltas, usage=usage)

    def response(self, deltas: list[list[CompletionChoice]], metas: list[dict], usage: Usage) -> CompletionResponse:
        choices = []
        for index, ds in enumerate(deltas):
            lp = None
            if self.want_lp:
                lp = CompletionLogprobs(top_logprobs=[] if self.top_n else None)
                for d in ds:
                    assert d.logprobs is not None
                    lp.tokens += d.logprobs.tokens
                    lp.token_logprobs += d.logprobs.token_logprobs
                    lp.text_offset += d.logprobs.text_offset
                    if lp.top_logprobs is not None:
                        lp.top_logprobs += d.logprobs.top_logprobs or []
            fr = metas[index]["finish_reason"]
            choices.append(CompletionChoice(index=index, text="".join(d.text for d in ds), logprobs=lp,
                                            finish_reason=_finish(fr), matched_stop=fr.get("matched") if fr else None))
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)


async def create_completion(state: ServerState, req: CompletionRequest, request: Request) -> Response:
    state.check_model(req.model)
    if req.suffix:
        raise bad_request("suffix is not supported", "suffix")
    if req.best_of not in (None, req.n):
        raise bad_request("best_of is not supported (it must equal n)", "best_of")
    prompts = prompts_of(state, req.prompt)
    sp = req.sampling_params(req.max_tokens, default_max_tokens=16)
    top_n = req.logprobs or 0
    if not 0 <= top_n <= 20:
        raise bad_request(f"logprobs must be in [0, 20], got {req.logprobs}", "logprobs")
    want_lp = req.logprobs is not None
    options = dict(return_logprob=want_lp, top_logprobs_num=top_n,
                   logprob_start_len=0 if req.echo and want_lp else -1)
    plan = Plan(expand([ids for ids, _ in prompts], sp, req.n), options, req.constraint_param(), req.stream,
                bool(req.stream_options and req.stream_options.include_usage))
    return await respond(state, request, plan, CompletionOutput(state, req, prompts))
