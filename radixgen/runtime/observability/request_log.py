"""The request log: one line per finished request at info level on the `radixgen.requests` logger.

    Finish: rid=3f2a... prompt_tokens=25 cached_tokens=16 completion_tokens=8 ttft=0.041s queue=0.002s
    e2e=0.160s finish_reason=stop constraint=json_schema stream=false

(on one line). With `log_requests` the line also carries the request body, by SGLang's
`--log-requests-level`: 0 nothing more, 1 the sampling parameters, 2 those and the prompt and
output text cut at 2048 characters each, 3 the whole texts. Texts are JSON-quoted, so a line never
breaks. The same fields ride on the log record as `record.request` (a dict), which the JSON log
format (log_format.py) writes as an object beside the summary (`record.summary`, without the bodies).
Sampling parameters are logged where they differ from the defaults.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Any

from radixgen.runtime.observability.records import RequestRecord
from radixgen.sampling.params import SamplingParams

logger = logging.getLogger("radixgen.requests")
TRUNCATE_AT = 2048  # characters of prompt / output at level 2 (SGLang's)
DEFAULTS = asdict(SamplingParams())  # sampling parameters are logged where they differ from these


class RequestLogger:
    """Formats and logs finished requests; `tokenizer` decodes prompts when bodies are logged."""

    def __init__(self, tokenizer: Any, log_requests: bool = False, level: int = 2) -> None:
        self.tokenizer = tokenizer
        self.level = level if log_requests else 0

    @property
    def wants_output_text(self) -> bool:
        """Whether records must keep the output text (bodies are logged)."""
        return self.level >= 2

    def fields(self, rec: RequestRecord) -> dict[str, Any]:
        """The structured fields of one request's line (seconds for durations)."""
        out: dict[str, Any] = {
            "rid": rec.rid, "prompt_tokens": rec.prompt_tokens, "cached_tokens": rec.cached_tokens,
            "completion_tokens": rec.completion_tokens, "ttft": _round(rec.ttft), "queue_time": _round(rec.queue_time),
            "e2e_latency": _round(rec.e2e), "finish_reason": rec.finish_reason, "constraint": rec.constraint or "none",
            "stream": rec.stream,
        }
        if rec.finish_message:
            out["message"] = rec.finish_message
        if self.level >= 1:
            out["sampling_params"] = {k: v for k, v in asdict(rec.params).items() if v != DEFAULTS[k]}
        if self.level >= 2:
            limit = TRUNCATE_AT if self.level == 2 else None
            out["prompt"] = _cut(self.tokenizer.decode(rec.input_ids, skip_special_tokens=False), limit)
            out["output"] = _cut(rec.output_text or "", limit)
        return out

    def log(self, rec: RequestRecord) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return
        f = self.fields(rec)
        parts = [f"rid={f['rid']}", f"prompt_tokens={f['prompt_tokens']}", f"cached_tokens={f['cached_tokens']}",
                 f"completion_tokens={f['completion_tokens']}", f"ttft={_seconds(f['ttft'])}",
                 f"queue={_seconds(f['queue_time'])}", f"e2e={_seconds(f['e2e_latency'])}",
                 f"finish_reason={f['finish_reason']}", f"constraint={f['constraint']}",
                 f"stream={'true' if rec.stream else 'false'}"]
        summary = "Finish: " + " ".join(parts)
        bodies = [f"{key}={json.dumps(f[key], ensure_ascii=False)}" for key in ("message", "sampling_params",
                                                                                "prompt", "output") if key in f]
        logger.info("%s", " ".join([summary, *bodies]), extra={"request": f, "summary": summary})


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}s"


def _cut(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + f"...({len(text) - limit} more characters)"
