"""Backend over an in-process `radixgen.runtime.engine.Engine` (what `set_default_backend(Engine())` uses).

Engine calls made per primitive:

- gen: one `engine.generate` (text prompt, or input_ids when token healing applies).
- select: one prefill of the shared prefix (`max_new_tokens=0`, cheap when already cached), then ONE
  batched `generate(input_ids=[...], max_new_tokens=0, return_logprob=True)` scoring every choice
  (unconditional_likelihood_normalized adds a second batched call for the unconditional logprobs).
- fork / run_batch: `cache_prefix(text)`, a `max_new_tokens=0` request that leaves the prefix in the
  radix cache for the branches.

Token boundaries. Tokenizing the prompt alone and the choice alone gives the wrong tokens when they
merge at the boundary (prompt "... is " + choice "Paris": the model would see " " + "Paris" instead
of " Paris"). So select tokenizes prompt + choice together and scores, for each choice, the tokens
after the longest prefix those ids share with the prompt's own ids: exactly the tokens whose text
covers the choice (possibly starting with a merged piece of the prompt's tail, like " Paris").

Token healing for gen (on by default here, `gen(token_healing=False)` turns it off): the prompt's last
token is backed up and generation is constrained (a regex `<that token's text>[\\s\\S]*`) to begin with
its text, so the model may pick a merged token (" Paris" after a trailing space). The healed text is
stripped from the value. It needs grammar constraints in the engine (probed once) and is skipped for
constrained gens, right after a role's begin string (the template boundary is what the model was
trained on), after special tokens, and when a stop string could match inside the healed text.

`stop_regex` (which the engine does not know): the gen streams, and once a pattern matches, the text is
cut at the end of the match and the request is closed (aborted); meta_info's finish_reason is then
`{"type": "stop", "matched": <pattern>}`. Logprob entries are (logprob, token id), or with
`return_text_in_logprobs` (logprob, token id, token text) as SGLang returns them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from radixgen.common.stop_regex import StopRegex
from radixgen.lang.backends.base import Backend, ChatTemplate, Context
from radixgen.lang.choices import ChoicesDecision, decide, requires_unconditional
from radixgen.lang.ir import SamplingParams

logger = logging.getLogger("radixgen.lang")

_REGEX_SPECIAL = set(".^$*+?{}[]\\|()/-\"")


def regex_literal(text: str) -> str:
    """A regex matching exactly `text` (portable escapes: no backslash-newline)."""
    out = []
    for c in text:
        if c in _REGEX_SPECIAL:
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif ord(c) < 0x20:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return "".join(out)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class EngineBackend(Backend):
    def __init__(self, engine: Any, token_healing: bool = True) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.token_healing = token_healing
        self._template: ChatTemplate | None = None
        self._constraints: bool | None = None
        self._lock = threading.Lock()
        hf = getattr(self.tokenizer, "hf", None)
        self._special = set(getattr(hf, "all_special_ids", []) or []) | set(self.tokenizer.eos_token_ids)
        bos = getattr(hf, "bos_token_id", None)
        self.context_token = bos if bos is not None else self.tokenizer.eos_token_ids[0]

    # ---- capabilities
    def get_chat_template(self) -> ChatTemplate:
        if self._template is None:
            tok = self.tokenizer
            if getattr(tok, "chat_template", None):
                self._template = ChatTemplate.from_apply(
                    lambda msgs, gen: tok.apply_chat_template(msgs, add_generation_prompt=gen))
            else:
                logger.warning("the model has no chat template; roles render as ChatML")
                self._template = ChatTemplate.chatml()
        return self._template

    def supports_constraints(self) -> bool:
        """Whether the engine enforces regex constraints (probed once with a 2-token request)."""
        with self._lock:
            if self._constraints is None:
                try:
                    out = self.engine.generate("Hi", {"max_new_tokens": 3, "temperature": 0, "regex": "zq"})
                    self._constraints = out["text"] == "zq"
                except Exception:
                    self._constraints = False
            return self._constraints

    # ---- calls
    def cache_prefix(self, text: str) -> None:
        if text:
            self._call(prompt=text, sampling_params={"max_new_tokens": 0})

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def get_model_name(self) -> str:
        """The model the engine was started with (its path or name; "default" for the built-in one)."""
        return str(getattr(getattr(self.engine, "config", None), "model", None) or "default")

    def get_server_info(self) -> dict:
        """The engine's configuration and live statistics (SGLang's /get_server_info shape)."""
        import dataclasses

        from radixgen import __version__

        config = getattr(self.engine, "config", None)
        info = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
        return {**info, "version": __version__, "internal_states": [self.engine.get_stats()]}

    def shutdown(self) -> None:
        self.engine.shutdown()

    def _call(self, **kw: Any) -> Any:
        out = self.engine.generate(**kw)
        for o in out if isinstance(out, list) else [out]:
            if not isinstance(o, dict):
                break
            fr = o["meta_info"].get("finish_reason") or {}
            if fr.get("type") == "abort":
                raise RuntimeError(f"the engine aborted the request: {fr.get('message') or fr}")
        return out

    def _prompt_kwargs(self, ctx: Context, params: SamplingParams) -> tuple[dict, str]:
        """Engine inputs for a gen (maybe token-healed) and the healed text to strip ("" if none)."""
        sp = params.to_engine()
        heal = self._healing(ctx, params)
        if heal is not None:
            ids, healed = heal
            sp["regex"] = regex_literal(healed) + r"[\s\S]*"
            sp["max_new_tokens"] = sp.get("max_new_tokens", 128) + 1
            return {"input_ids": ids, "sampling_params": sp}, healed
        if not ctx.text:
            return {"input_ids": [self.context_token], "sampling_params": sp}, ""
        return {"prompt": ctx.text, "sampling_params": sp}, ""

    def _healing(self, ctx: Context, params: SamplingParams) -> tuple[list[int], str] | None:
        enabled = params.token_healing if params.token_healing is not None else self.token_healing
        if not enabled or params.is_constrained or not ctx.text or (params.n or 1) > 1 or params.stop_regex:
            return None
        if ctx.role is not None and ctx.role_text == "":
            return None
        ids = self.tokenizer.encode(ctx.text)
        if len(ids) < 2 or ids[-1] in self._special:
            return None
        healed = self.tokenizer.decode([ids[-1]], skip_special_tokens=False)
        if not healed or "\ufffd" in healed or not ctx.text.endswith(healed):
            return None
        for s in params.stop or ():
            if s in healed or any(s.startswith(healed[-k:]) for k in range(1, len(healed) + 1)):
                return None
        if not self.supports_constraints():
            return None
        return ids[:-1], healed

    def _logprob_kwargs(self, params: SamplingParams) -> dict:
        return {"return_logprob": bool(params.return_logprob), "top_logprobs_num": params.top_logprobs_num or 0,
                "logprob_start_len": -1 if params.logprob_start_len is None else params.logprob_start_len}

    def generate(self, ctx: Context, params: SamplingParams) -> tuple[str | list[str], dict]:
        if params.stop_regex:
            if (params.n or 1) > 1:
                raise ValueError("gen(stop_regex=...) takes n=1 (run the gen n times instead)")
            value, meta = "", {}
            for delta, chunk_meta in self.generate_stream(ctx, params):
                value, meta = value + delta, chunk_meta
            return value, meta
        kw, healed = self._prompt_kwargs(ctx, params)
        out = self._call(**kw, **self._logprob_kwargs(params))
        if isinstance(out, list):  # n > 1
            metas = [self._with_token_text(o["meta_info"], params) for o in out]
            meta = {"prompt_tokens": metas[0]["prompt_tokens"], "cached_tokens": metas[0]["cached_tokens"],
                    "completion_tokens": sum(m["completion_tokens"] for m in metas), "n": metas}
            return [_strip(o["text"], healed) for o in out], meta
        meta = dict(self._with_token_text(out["meta_info"], params), output_ids=out["output_ids"])
        if healed:
            meta["token_healing"] = healed
        return _strip(out["text"], healed), meta

    def generate_stream(self, ctx: Context, params: SamplingParams) -> Iterator[tuple[str, dict | None]]:
        """(delta text, meta info so far) per chunk; the last chunk's meta has the finish_reason."""
        kw, healed = self._prompt_kwargs(ctx, params)
        stop = StopRegex.from_param(params.stop_regex)
        pending = healed  # healed text still to strip from the start of the stream
        text_so_far = ""
        chunks = self.engine.generate(**kw, stream=True, **self._logprob_kwargs(params))
        try:
            for chunk in chunks:
                text, meta = chunk["text"], self._with_token_text(chunk["meta_info"], params)
                if pending:
                    k = min(len(pending), len(text))
                    if text[:k] == pending[:k]:
                        text, pending = text[k:], pending[k:]
                    else:
                        pending = ""
                fr = meta.get("finish_reason")
                if fr is not None and fr.get("type") == "abort":
                    raise RuntimeError(f"the engine aborted the request: {fr.get('message') or fr}")
                match = stop.match(text_so_far + text) if stop is not None else None
                if match is not None:
                    yield text[: max(match.end - len(text_so_far), 0)], dict(
                        meta, finish_reason={"type": "stop", "matched": match.pattern})
                    return  # closing the stream aborts the request
                text_so_far += text
                if fr is not None and healed:
                    meta = dict(meta, token_healing=healed)
                yield text, meta
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _with_token_text(self, meta: dict, params: SamplingParams) -> dict:
        """meta_info with logprob entries as (logprob, id, text) when return_text_in_logprobs is set."""
        if not params.return_text_in_logprobs or "output_token_logprobs" not in meta:
            return meta
        meta = dict(meta)
        for key in ("input_token_logprobs", "output_token_logprobs"):
            meta[key] = [self._entry_with_text(e) for e in meta.get(key) or []]
        for key in ("input_top_logprobs", "output_top_logprobs"):
            if key in meta:
                meta[key] = [None if row is None else [self._entry_with_text(e) for e in row] for row in meta[key]]
        return meta

    def _entry_with_text(self, entry: Sequence) -> tuple:
        lp, tid = entry[0], entry[1]
        text = entry[2] if len(entry) > 2 and entry[2] is not None else \
            self.tokenizer.decode([tid], skip_special_tokens=False)
        return (lp, tid, text)

    def select(self, ctx: Context, choices: Sequence[str], temperature: float, choices_method: Any
               ) -> ChoicesDecision:
        tok = self.tokenizer
        if ctx.text:
            prompt_ids = tok.encode(ctx.text)
            fulls = [tok.encode(ctx.text + c) for c in choices]
        else:  # nothing to condition on: a one-token context gives the first choice token a logprob
            prompt_ids = [self.context_token]
            fulls = [[self.context_token, *tok.encode(c)] for c in choices]
        # k: where choice i's tokens start; at least one token each, never position 0.
        ks = [max(1, min(common_prefix_len(prompt_ids, f), len(f) - 1)) for f in fulls]
        m = min(ks)
        if m > 1:
            self._call(input_ids=prompt_ids[:m], sampling_params={"max_new_tokens": 0})
        outs = self._call(input_ids=fulls, sampling_params=[{"max_new_tokens": 0}] * len(fulls),
                          return_logprob=True, logprob_start_len=m)
        token_logprobs = [_tail_logprobs(o, len(f) - k) for o, f, k in zip(outs, fulls, ks, strict=True)]
        meta = {"prompt_tokens": sum(o["meta_info"]["prompt_tokens"] for o in outs),
                "cached_tokens": sum(o["meta_info"]["cached_tokens"] for o in outs), "completion_tokens": 0,
                "choice_token_ids": [f[k:] for f, k in zip(fulls, ks, strict=True)]}
        unconditional = None
        if requires_unconditional(choices_method):
            uncond_ids = [[self.context_token, *f[k:]] for f, k in zip(fulls, ks, strict=True)]
            uouts = self._call(input_ids=uncond_ids, sampling_params=[{"max_new_tokens": 0}] * len(fulls),
                               return_logprob=True, logprob_start_len=1)
            unconditional = [_tail_logprobs(o, len(u) - 1) for o, u in zip(uouts, uncond_ids, strict=True)]
        decision = decide(choices_method, choices, token_logprobs, unconditional, temperature)
        decision.meta_info.update(meta)
        return decision


def _strip(text: str, healed: str) -> str:
    return text[len(healed):] if healed and text.startswith(healed) else text


def _tail_logprobs(out: dict, count: int) -> list[float]:
    """The logprobs of the last `count` prompt tokens of a scoring result."""
    entries = out["meta_info"]["input_token_logprobs"][-count:] if count else []
    if len(entries) != count:
        raise RuntimeError(f"engine returned {len(entries)} prompt logprobs, expected {count}")
    return [0.0 if e[0] is None else float(e[0]) for e in entries]
