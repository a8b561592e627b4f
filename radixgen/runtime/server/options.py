"""ServerOptions: the HTTP server's own settings (request limits, auth scope), one frozen dataclass.

The `radixgen serve` flags are generated from these fields exactly as the engine flags are from
`EngineConfig` (cli.py), so a flag and a field never drift: `max_request_bytes` is
`--max-request-bytes`, its help the docstring under the field. Engine-wide settings (the KV pool,
the batch size, grammar compile threads and deadline) stay in `EngineConfig`.

The defaults follow the hosted OpenAI API where it publishes a limit (n <= 128, 128 tools, a
`max_tokens` over the context room is an error) and otherwise keep one request from costing more
than a few seconds of a shared CPU. Schema compile time grows steeply with nesting and with optional
properties (XGrammar 0.2.9, SmolLM2 vocabulary, 2 shared cores: an object nested 64 deep (129 JSON
levels) 0.06 s, 128 deep 0.23 s, 256 deep 1.7 s, 450 deep 35 s; 1000 optional properties 1.8 s),
hence 64 JSON levels and 64 KiB; the compile deadline (EngineConfig) is the backstop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Literal

from radixgen.runtime.server.chat_templates import load_chat_template


@dataclass(frozen=True)
class ServerOptions:
    """Limits on what one request may ask for, and which routes need the API key."""

    max_request_bytes: int = 8 * 1024 * 1024
    """Largest request body in bytes; a larger one gets 413 before it is read."""
    max_prompt_tokens: int | None = None
    """Most prompt tokens per prompt (default: the context length minus one)."""
    max_n: int = 128
    """Most sequences one request may start (n, times the prompt count for a batched completion)."""
    max_stop_strings: int = 16
    """Most stop strings per request."""
    max_stop_length: int = 256
    """Longest stop string in characters."""
    max_tools: int = 128
    """Most tools in a chat request."""
    max_schema_bytes: int = 64 * 1024
    """Largest JSON schema (compact JSON), regex or EBNF text in bytes, per constraint and per tool."""
    max_schema_depth: int = 64
    """Deepest nesting of objects and arrays in a JSON schema (compile time grows steeply with it)."""
    max_queued_requests: int = 1024
    """Sequences allowed to wait beyond max_running_requests; past that requests get 429 + Retry-After."""
    max_request_kv_fraction: float = 0.5
    """Largest share of the KV pool one request may claim: its prompts plus n x max_tokens."""
    allow_auto_truncate: bool = False
    """Cut a max_tokens that does not fit the context to the room left, instead of answering 400."""
    public_metrics: bool = False
    """Serve /metrics without the API key (for a Prometheus scraper); /health is always open."""
    reject_unknown_fields: bool = False
    """Answer 400 for a top-level field a chat or completions request does not define, as the hosted OpenAI
    API does (default: ignore it, as SGLang and vLLM do; /generate always refuses unknown fields)."""
    max_stored_responses: int = 1024
    """Most responses /v1/responses keeps (store=true) for GET and previous_response_id; the least recently
    used is evicted first."""
    loop_stall_dump: float | None = None
    """Debugging: when the event loop answers nothing for this many seconds, dump every thread's stack to stderr."""
    chat_template: str | None = None
    """The chat template to use instead of the tokenizer's: a Jinja file path or a known name (chat_prompt.py)."""
    default_chat_template_kwargs: str | None = None
    """A JSON object of variables passed to every chat template render, e.g. '{"enable_thinking": false}'; a
    request's chat_template_kwargs override them."""
    embedding_pooling: Literal["last", "mean"] = "last"
    """How /v1/embeddings pools a prompt's final hidden states: its last token or the mean of all its tokens."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (bool, str)) or value is None:
                continue
            if value < 0 or (value == 0 and f.name != "max_queued_requests"):
                raise ValueError(f"ServerOptions.{f.name}={value!r} is invalid: must be > 0")
        if self.max_request_kv_fraction > 1:
            raise ValueError(f"ServerOptions.max_request_kv_fraction={self.max_request_kv_fraction!r} is invalid: "
                             "must be in (0, 1]")
        self.template_kwargs()
        if self.chat_template is not None:
            load_chat_template(self.chat_template)

    def template_kwargs(self) -> dict:
        """`default_chat_template_kwargs` as a dict (ValueError naming the option when it is not a JSON object)."""
        if self.default_chat_template_kwargs is None:
            return {}
        try:
            value = json.loads(self.default_chat_template_kwargs)
        except ValueError as e:
            raise ValueError(f"ServerOptions.default_chat_template_kwargs is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError("ServerOptions.default_chat_template_kwargs must be a JSON object, e.g. "
                             '\'{"enable_thinking": false}\'')
        return value

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
