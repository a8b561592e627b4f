"""Backend for any OpenAI-compatible server, through the official `openai` client.

- Chat models (`is_chat_model=True`, the default): the program's closed turns go as `messages`; a
  `gen` / `select` must open an assistant turn (`sgl.assistant(sgl.gen(...))`), since a chat API
  cannot continue a partial message. Completion models send the program text as `prompt`.
- `json_schema` -> `response_format={"type": "json_schema", ...}` on chat models (standard OpenAI);
  `regex`, `top_k`, `min_p`, `min_tokens`, `ignore_eos`, `stop_token_ids` (and json_schema on
  completion models) go in `extra_body` with SGLang's names: radixgen serve and SGLang take them; a
  server that rejects them gets a clear error naming the fields.
- `select`: on completion models, by scoring (prompt logprobs via `echo=True, logprobs=0`) when the
  server returns them, with the chosen choices method; otherwise (chat models, or no prompt logprobs)
  by constrained generation: `response_format` json_schema with an `enum` (select_mode="json_schema",
  the default for chat) or an SGLang `regex` alternation (select_mode="regex"). Constrained select
  has no scores, so only the default method is accepted there; unconditional_likelihood_normalized
  is not available on this backend.
- No prefix cache control: `cache_prefix` is a no-op (servers with automatic prefix caching still
  reuse prefixes; `cached_tokens` comes from `usage.prompt_tokens_details` when the server reports it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from radixgen.lang.backends.base import Backend, ChatTemplate, Context
from radixgen.lang.choices import ChoicesDecision, decide, requires_unconditional, token_length_normalized
from radixgen.lang.ir import SamplingParams

COMPLETION_MODELS = {"gpt-3.5-turbo-instruct", "davinci-002", "babbage-002"}


class OpenAI(Backend):
    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 is_chat_model: bool | None = None, chat_template: ChatTemplate | None = None,
                 select_mode: str = "auto", **client_kwargs: Any) -> None:
        import openai

        if select_mode not in ("auto", "logprobs", "json_schema", "regex"):
            raise ValueError("select_mode must be 'auto', 'logprobs', 'json_schema' or 'regex'")
        self.model_name = model_name
        self.is_chat_model = model_name not in COMPLETION_MODELS if is_chat_model is None else is_chat_model
        self.chat_template = chat_template or ChatTemplate.chatml()
        self.select_mode = select_mode
        self._openai = openai
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.client = openai.OpenAI(base_url=base_url, api_key=key, **client_kwargs)
        self._prompt_logprobs: bool | None = None  # learned on first scoring select

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    # ---- request building
    def _check_chat_turn(self, ctx: Context, what: str) -> None:
        if ctx.role != "assistant" or ctx.role_text:
            raise ValueError(
                f"{what} on the chat model {self.model_name!r} must start an assistant turn "
                f"(s += sgl.assistant(sgl.{what}(...))): a chat API cannot continue partial text. "
                f"Use a completion model (OpenAI(..., is_chat_model=False)) to generate anywhere.")

    def _kwargs(self, params: SamplingParams) -> tuple[dict, list[str]]:
        """Request arguments and the names of the non-standard fields sent in extra_body."""
        for name in ("stop_regex", "logprob_start_len"):
            if getattr(params, name) not in (None, ()):
                raise ValueError(f"gen({name}=...) is not part of the OpenAI API; run this program on "
                                 f"sgl.Engine() or sgl.RuntimeEndpoint(url) instead")
        kw: dict[str, Any] = {"model": self.model_name}
        for ours, theirs in (("max_new_tokens", "max_tokens"), ("temperature", "temperature"),
                             ("top_p", "top_p"), ("frequency_penalty", "frequency_penalty"),
                             ("presence_penalty", "presence_penalty")):
            if getattr(params, ours) is not None:
                kw[theirs] = getattr(params, ours)
        stop = [s for s in (params.stop or ()) if s != self.chat_template.stop_str or not self.is_chat_model]
        if stop:
            kw["stop"] = stop
        if (params.n or 1) > 1:
            kw["n"] = params.n
        if params.return_logprob:
            if self.is_chat_model:
                kw["logprobs"], kw["top_logprobs"] = True, params.top_logprobs_num or 0
            else:
                kw["logprobs"] = max(1, params.top_logprobs_num or 0)
        extra: dict[str, Any] = {}
        if params.top_k not in (None, -1):
            extra["top_k"] = params.top_k
        if params.min_p:
            extra["min_p"] = params.min_p
        if params.min_new_tokens:
            extra["min_tokens"] = params.min_new_tokens
        if params.ignore_eos:
            extra["ignore_eos"] = True
        if params.skip_special_tokens is False:
            extra["skip_special_tokens"] = False
        if params.stop_token_ids:
            extra["stop_token_ids"] = list(params.stop_token_ids)
        if params.regex is not None:
            extra["regex"] = params.regex
        if params.json_schema is not None:
            if self.is_chat_model:
                kw["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": "output", "schema": json.loads(params.json_schema)}}
            else:
                extra["json_schema"] = params.json_schema
        if extra:
            kw["extra_body"] = extra
        return kw, sorted(extra)

    def _create(self, chat: bool, extra_names: Sequence[str], **kw: Any) -> Any:
        api = self.client.chat.completions if chat else self.client.completions
        try:
            return api.create(**kw)
        except self._openai.BadRequestError as e:
            if extra_names:
                raise RuntimeError(
                    f"the server rejected a request using {list(extra_names)}, which are not standard OpenAI "
                    f"fields; this server may not support them (radixgen serve and SGLang do): {e}") from e
            raise

    @staticmethod
    def _meta(resp: Any) -> dict:
        usage = getattr(resp, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None)
        return {"prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
                "completion_tokens": getattr(usage, "completion_tokens", 0) or 0,
                "cached_tokens": getattr(details, "cached_tokens", 0) or 0,
                "finish_reason": [c.finish_reason for c in resp.choices], "id": getattr(resp, "id", None)}

    # ---- primitives
    def generate(self, ctx: Context, params: SamplingParams) -> tuple[str | list[str], dict]:
        kw, extra = self._kwargs(params)
        if self.is_chat_model:
            self._check_chat_turn(ctx, "gen")
            resp = self._create(True, extra, messages=ctx.messages, **kw)
            texts = [c.message.content or "" for c in resp.choices]
        else:
            resp = self._create(False, extra, prompt=ctx.text, **kw)
            texts = [c.text for c in resp.choices]
        meta = self._meta(resp)
        return (texts if (params.n or 1) > 1 else texts[0]), meta

    def generate_stream(self, ctx: Context, params: SamplingParams) -> Iterator[tuple[str, dict | None]]:
        kw, extra = self._kwargs(params)
        if self.is_chat_model:
            self._check_chat_turn(ctx, "gen")
            stream = self._create(True, extra, messages=ctx.messages, stream=True, **kw)
        else:
            stream = self._create(False, extra, prompt=ctx.text, stream=True, **kw)
        finish = None
        for chunk in stream:
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            delta = (c.delta.content or "") if self.is_chat_model else (c.text or "")
            finish = c.finish_reason or finish
            if delta:
                yield delta, None
        yield "", {"finish_reason": finish, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}

    def select(self, ctx: Context, choices: Sequence[str], temperature: float, choices_method: Any
               ) -> ChoicesDecision:
        if requires_unconditional(choices_method):
            raise ValueError("unconditional_likelihood_normalized is not available with the OpenAI backend; "
                             "use token_length_normalized or greedy_token_selection")
        mode = self.select_mode
        if mode == "auto":
            mode = "json_schema" if self.is_chat_model else "logprobs"
        if mode == "logprobs":
            if self.is_chat_model:
                raise ValueError("select_mode='logprobs' needs a completion model: chat APIs return no prompt "
                                 "logprobs")
            if self._prompt_logprobs is not False:
                scored = self._select_by_logprobs(ctx, choices)
                if scored is not None:
                    return decide(choices_method, choices, scored[0], None, temperature)
            if self.select_mode == "logprobs":
                raise RuntimeError(f"the server at {self.client.base_url} returns no prompt logprobs "
                                   f"(echo=True, logprobs=0), which select_mode='logprobs' needs")
            mode = "regex"
        if choices_method not in (None, token_length_normalized):
            raise ValueError(f"select on {self.model_name!r} is constrained generation (no prompt logprobs), "
                             f"which has no scores for {getattr(choices_method, '__name__', choices_method)}; "
                             f"use the default token_length_normalized")
        return self._select_constrained(ctx, choices, mode)

    def _select_by_logprobs(self, ctx: Context, choices: Sequence[str]) -> tuple[list[list[float]]] | None:
        """Score each choice from echoed prompt logprobs; None when the server cannot."""
        start = len(ctx.text)
        try:
            resp = self.client.completions.create(
                model=self.model_name, prompt=[ctx.text + c for c in choices], max_tokens=1, echo=True,
                logprobs=0, temperature=0)
            by_index = sorted(resp.choices, key=lambda c: c.index)
            token_logprobs = []
            for c, choice in zip(by_index, choices, strict=True):
                lp = c.logprobs
                end = start + len(choice)
                picked = [0.0 if p is None else float(p)
                          for tok, off, p in zip(lp.tokens, lp.text_offset, lp.token_logprobs, strict=True)
                          if off < end and off + len(tok) > start]
                if not picked:
                    raise ValueError("no tokens cover the choice")
                token_logprobs.append(picked)
        except (self._openai.APIStatusError, AttributeError, TypeError, ValueError):
            self._prompt_logprobs = False
            return None
        self._prompt_logprobs = True
        return (token_logprobs,)

    def _select_constrained(self, ctx: Context, choices: Sequence[str], mode: str) -> ChoicesDecision:
        params = SamplingParams(max_new_tokens=max(16, 4 + max(len(c) for c in choices)), temperature=0.0)
        if mode == "json_schema" and self.is_chat_model:
            self._check_chat_turn(ctx, "select")
            schema = {"type": "object", "properties": {"choice": {"type": "string", "enum": list(choices)}},
                      "required": ["choice"], "additionalProperties": False}
            kw, extra = self._kwargs(params)
            kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "select", "schema": schema}}
            resp = self._create(True, extra, messages=ctx.messages, **kw)
            raw = resp.choices[0].message.content or ""
            try:
                value = json.loads(raw)["choice"]
            except (ValueError, KeyError, TypeError):
                value = raw
        else:
            from radixgen.lang.backends.engine import regex_literal

            params = SamplingParams(max_new_tokens=params.max_new_tokens, temperature=0.0,
                                    regex="(" + "|".join(regex_literal(c) for c in choices) + ")")
            value, _ = self.generate(ctx, params)
            resp = None
        if value not in choices:
            raise RuntimeError(f"the server did not constrain the select: it answered {value!r}, not one of "
                               f"{list(choices)}; it may not support {mode} constraints")
        meta = self._meta(resp) if resp is not None else {}
        meta.update({"method": f"constrained_{mode}", "scores": None})
        return ChoicesDecision(value, meta)
