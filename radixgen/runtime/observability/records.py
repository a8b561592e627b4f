"""RequestRecord: what one finished request tells metrics, logs and traces (built from its final meta_info)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixgen.sampling.params import SamplingParams


@dataclass(frozen=True)
class RequestRecord:
    """One finished request. Durations in seconds; `finished_at` in seconds since the epoch."""

    rid: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "abort"
    finish_message: str | None
    stream: bool
    constraint: str | None  # "json_schema" | "regex" | "ebnf" | "structural_tag", or None
    e2e: float
    queue_time: float | None  # None: never scheduled (aborted while waiting)
    ttft: float | None  # None: no token was produced
    grammar_wait: float | None  # how long the request waited for its grammar compile; None: did not wait
    finished_at: float
    params: SamplingParams
    input_ids: list[int]
    output_text: str | None  # kept only when request bodies are logged

    @classmethod
    def from_meta(cls, meta: dict[str, Any], *, params: SamplingParams, input_ids: list[int], stream: bool,
                  grammar_wait: float | None, finished_at: float, output_text: str | None) -> RequestRecord:
        fr = meta["finish_reason"]
        return cls(
            rid=meta["id"], prompt_tokens=meta["prompt_tokens"], cached_tokens=meta["cached_tokens"],
            completion_tokens=meta["completion_tokens"], finish_reason=fr["type"], finish_message=fr.get("message"),
            stream=stream, constraint=params.constraint[0] if params.constraint else None, e2e=meta["e2e_latency"],
            queue_time=meta.get("queue_time"), ttft=meta.get("first_token_latency"), grammar_wait=grammar_wait,
            finished_at=finished_at, params=params, input_ids=input_ids, output_text=output_text,
        )

    @property
    def started_at(self) -> float:
        """When the request was created (epoch seconds)."""
        return self.finished_at - self.e2e

    @property
    def time_per_output_token(self) -> float | None:
        """SGLang's TPOT: (finish - first token) / (completion tokens - 1); None below two tokens."""
        if self.ttft is None or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)
