"""The Backend interface the interpreter calls, the chat-template role renderer, the default backend.

A backend turns one `gen` / `select` of a running program into model calls. The interpreter passes a
`Context` (the program's text so far, its closed chat messages and the open role) and the merged
`SamplingParams`; it never tokenizes. Methods a backend implements:

    get_chat_template() -> ChatTemplate        how roles render into text (begin / end strings)
    cache_prefix(text)                         prefill `text` so later calls reuse its KV (fork, run_batch)
    generate(ctx, params) -> (str | list[str], meta)          meta: prompt_tokens, cached_tokens,
                                               completion_tokens, finish_reason (+ logprobs if asked)
    generate_stream(ctx, params) -> iterator of (delta_text, meta | None)   meta so far (None if the
                                               backend has none yet); the last one has the finish_reason
    select(ctx, choices, temperature, choices_method) -> ChoicesDecision    meta_info has the scores
    flush_cache(); shutdown(); get_model_name(); get_server_info()

Role rendering: `ChatTemplate.from_apply(apply)` derives each role's begin / end strings from the
model's own template by rendering sentinel messages and splitting on the sentinel, and detects a
default system prompt (SmolLM2's ChatML inserts one when the first message is not a system one): it
is emitted once, as part of the first non-system role's begin string when no system role came first.

Which backend a program runs on (the default backend, wrapping an Engine) is default.py's business.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixgen.lang.ir import ROLES, SamplingParams

logger = logging.getLogger("radixgen.lang")


@dataclass
class Context:
    """What a backend sees of a program at a `gen` / `select`."""

    text: str
    messages: list[dict] = field(default_factory=list)  # closed turns [{"role", "content"}]
    role: str | None = None  # the open role, if any
    role_text: str = ""  # text appended inside the open role so far


@dataclass(frozen=True)
class ChatTemplate:
    """Begin / end strings of each role, derived from a model's chat template."""

    first_prefix: dict[str, str]  # begin string when the role opens the conversation
    prefix: dict[str, str]  # begin string for later turns
    suffix: dict[str, str]
    default_system: str = ""  # what first_prefix adds for a non-system first role ("" if none)
    stop_str: str | None = None  # end-of-turn string, added to gen stops inside assistant turns

    def begin(self, role: str, first: bool) -> str:
        return (self.first_prefix if first else self.prefix)[role]

    def end(self, role: str) -> str:
        return self.suffix[role]

    @classmethod
    def chatml(cls) -> ChatTemplate:
        return cls.from_apply(_apply_chatml)

    @classmethod
    def from_apply(cls, apply: Callable[[list[dict], bool], str]) -> ChatTemplate:
        """Derive the role strings from `apply(messages, add_generation_prompt) -> str`."""
        s = [f"RGXSENT{i}XRG" for i in range(4)]

        def split(msgs: list[dict], ctx: list[dict]) -> tuple[str, str] | None:
            try:
                full = apply(ctx + msgs, False)
                base = apply(ctx, False) if ctx else ""
            except Exception:  # the template rejects this order (e.g. strict alternation)
                return None
            if not full.startswith(base) or msgs[-1]["content"] not in full[len(base):]:
                return None
            pre, _, post = full[len(base):].partition(msgs[-1]["content"])
            return pre, post

        sys0 = {"role": "system", "content": s[0]}
        user1 = {"role": "user", "content": s[1]}
        asst2 = {"role": "assistant", "content": s[2]}
        first_prefix, prefix, suffix = {}, {}, {}
        later_contexts = {"system": [[user1, asst2]], "user": [[sys0], [user1, asst2]],
                          "assistant": [[user1], [sys0, user1]]}
        for role in ROLES:
            tgt = {"role": role, "content": s[3]}
            first = split([tgt], [])
            later = next((f for ctx in later_contexts[role] if (f := split([tgt], ctx))), None)
            if first is None and later is None:
                raise ValueError(f"cannot derive the {role!r} role from this chat template")
            first, later = first or later, later or first
            first_prefix[role], prefix[role], suffix[role] = first[0], later[0], later[1]
        # What the template adds before a first non-system turn (a default system prompt and/or BOS).
        fp, p = first_prefix["user"], prefix["user"]
        default_system = fp[: len(fp) - len(p)] if fp.endswith(p) else ""
        stop = suffix["assistant"].strip() or None
        return cls(first_prefix, prefix, suffix, default_system, stop)


def _apply_chatml(messages: list[dict], add_generation_prompt: bool) -> str:
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class Backend:
    """Base class; see the module docstring for the contract."""

    is_chat_model: bool = False  # True: the remote takes messages, not text (OpenAI chat models)

    def get_chat_template(self) -> ChatTemplate:
        return ChatTemplate.chatml()

    def cache_prefix(self, text: str) -> None:  # default: nothing to warm
        return None

    def generate(self, ctx: Context, params: SamplingParams) -> tuple[str | list[str], dict]:
        raise NotImplementedError

    def generate_stream(self, ctx: Context, params: SamplingParams) -> Iterator[tuple[str, dict | None]]:
        text, meta = self.generate(ctx, params)  # fallback: one chunk
        yield (text if isinstance(text, str) else text[0]), meta

    def select(self, ctx: Context, choices: Sequence[str], temperature: float, choices_method: Any):
        raise NotImplementedError

    def flush_cache(self) -> None:
        return None

    def get_model_name(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} does not report a model name")

    def get_server_info(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} has no server info")

    def shutdown(self) -> None:
        return None
