"""Periodic batch statistics on the `radixgen.batch` logger, in SGLang's words.

Every `stats_log_interval` seconds in which the engine did work, the observer passes a fresh
`Engine.get_stats()` snapshot here and gets up to two info lines, as SGLang's scheduler prints them:

    Prefill batch, #new-seq: 3, #new-token: 412, #cached-token: 96, token usage: 0.02, #running-req: 5,
    #queue-req: 0, input throughput (token/s): 81.93
    Decode batch, #running-req: 5, #token: 530, token usage: 0.02, gen throughput (token/s): 44.10,
    #queue-req: 0

(each on one line). SGLang prints a line per prefill batch and every 40 decode steps; these sum the
steps since the previous line instead, so the rates are over that interval. An idle interval
prints nothing. The numbers ride on the record as `record.stats` for the JSON log format.
"""

from __future__ import annotations

import logging
from typing import Any

from radixgen.runtime.scheduler.metrics import at_start

logger = logging.getLogger("radixgen.batch")


class BatchStatsLogger:
    """Turns successive stats snapshots into SGLang-style batch lines."""

    def __init__(self) -> None:
        self._last: dict[str, Any] | None = None

    def lines(self, stats: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """(message, fields) of the lines for the interval since the previous call (or since the
        engine started)."""
        last, self._last = self._last or at_start(stats), stats
        elapsed = max(stats["time"] - last["time"], 1e-9)
        new = {k: stats[k] - last[k] for k in ("requests_admitted", "prompt_tokens", "cached_prompt_tokens",
                                                 "generated_tokens")}
        in_use = stats["kv_used"] - stats["kv_evictable"]
        common = {"running": stats["running"], "queued": stats["waiting"], "tokens": in_use,
                  "token_usage": round(in_use / stats["kv_capacity"], 4)}
        out = []
        if new["requests_admitted"] or new["prompt_tokens"]:
            f = {"kind": "prefill", "new_seqs": new["requests_admitted"], "new_tokens": new["prompt_tokens"],
                 "cached_tokens": new["cached_prompt_tokens"], **common,
                 "input_throughput": round(new["prompt_tokens"] / elapsed, 2)}
            out.append((f"Prefill batch, #new-seq: {f['new_seqs']}, #new-token: {f['new_tokens']}, "
                        f"#cached-token: {f['cached_tokens']}, token usage: {in_use / stats['kv_capacity']:.2f}, "
                        f"#running-req: {f['running']}, #queue-req: {f['queued']}, "
                        f"input throughput (token/s): {f['input_throughput']:.2f}", f))
        if new["generated_tokens"]:
            f = {"kind": "decode", **common, "gen_throughput": round(new["generated_tokens"] / elapsed, 2)}
            out.append((f"Decode batch, #running-req: {f['running']}, #token: {in_use}, "
                        f"token usage: {in_use / stats['kv_capacity']:.2f}, "
                        f"gen throughput (token/s): {f['gen_throughput']:.2f}, #queue-req: {f['queued']}", f))
        return out

    def log(self, stats: dict[str, Any]) -> None:
        for message, fields in self.lines(stats):
            logger.info(message, extra={"stats": fields})
