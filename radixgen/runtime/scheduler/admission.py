"""Admission: which requests run in the next step, and how many tokens of each.

Decoding requests come first (one token each; when KV runs short the least advanced are retracted
to the waiting queue), then unfinished chunked prefills, then waiting requests in policy order
(`lpm`: longest cached prefix first; `fcfs`), all under the step's prompt-token budget
(`chunked_prefill_size`) and the free + evictable KV. Two waiting requests that share a long
uncached prefix are not admitted in the same step: the second waits a step and reuses the first's
KV from the tree instead of computing the same prefix twice.
"""

from __future__ import annotations

import time

import torch

from radixgen.radix_cache.radix_tree import RadixCache
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.scheduler.kv_manager import KVManager
from radixgen.runtime.scheduler.metrics import SchedulerMetrics
from radixgen.runtime.scheduler.request import Req

LPM_FALLBACK_QUEUE_LEN = 128  # past this many waiting requests lpm's matching costs more than it saves
DECODE_RESERVE_TOKENS = 8  # KV kept free per running request when admitting new prefills
IN_BATCH_SHARED_TOKENS = 32  # a waiting request sharing this many uncached tokens with one admitted
# in the same step waits a step, so it reuses that prefix from the tree instead of computing it again


class Admission:
    """Picks each step's requests and chunk lengths; moves requests between the two queues
    (admitted: waiting -> running; retracted: running -> waiting) through the KV manager."""

    def __init__(self, config: EngineConfig, kv: KVManager, metrics: SchedulerMetrics) -> None:
        self.config = config
        self.kv = kv
        self.metrics = metrics

    def plan(self, running: list[Req], waiting: list[Req], can_retract: bool) -> tuple[list[Req], list[int]] | None:
        """(requests in running order, tokens to compute for each), or None when nothing can run.

        With a batch in flight (`can_retract` False) a KV shortage for the decodes returns None
        instead of retracting, so the in-flight batch is processed first.
        """
        kv = self.kv
        # a request holding for its drafts' verification waits for it (see `speculator.py`)
        active = [r for r in running if r.finished is None and not r.flight.skip and not r.flight.held]
        decodes = [r for r in active if r.is_decoding and r.wants_more]
        if kv.available() < len(decodes):
            if not can_retract:
                return None
            while decodes and kv.available() < len(decodes):
                decodes.remove(self._retract(decodes, running, waiting))
        chunks: dict[int, int] = {id(r): 1 for r in decodes}  # by object: rids come from users
        need, budget = len(decodes), self.config.chunked_prefill_size
        for req in [r for r in active if not r.is_decoding]:  # unfinished chunked prefills
            n = min(req.extend_len, budget)
            if n <= 0 or need + n > kv.available():
                continue
            chunks[id(req)], budget, need = n, budget - n, need + n
        # every unfinished prompt counts, a held or in-flight one too: its prefix is not in the tree yet
        in_progress = self._prompts_in_progress([r for r in running if r.finished is None]) if waiting else None
        for req in self._ordered(waiting):
            if budget <= 0 or not kv.has_free_row() or len(running) >= self.config.max_running_requests:
                break
            self._match(req)
            if in_progress is not None:
                key = req.radix_key(req.prefix_cap())
                if in_progress.match_prefix(key).prefix_len - req.kv.kv_len >= IN_BATCH_SHARED_TOKENS:
                    kv.unmatch(req)
                    continue
                in_progress.insert(key, torch.zeros(len(key.token_ids), dtype=torch.int64))
            n = min(req.extend_len, budget)
            if need + n > kv.available() - DECODE_RESERVE_TOKENS * len(running) and running:
                kv.unmatch(req)
                break
            kv.admit(req)
            waiting.remove(req)
            running.append(req)
            if req.scheduled_time is None:  # first admission (a retracted request comes back later)
                req.scheduled_time = time.perf_counter()
                self.metrics.on_admit(req.cached_tokens)
            chunks[id(req)], budget, need = n, budget - n, need + n
        reqs = [r for r in running if id(r) in chunks]
        return (reqs, [chunks[id(r)] for r in reqs]) if reqs else None

    def _match(self, req: Req) -> None:
        prefix = self.kv.match(req)
        if not req.output_ids:
            req.cached_tokens = prefix

    def _retract(self, candidates: list[Req], running: list[Req], waiting: list[Req]) -> Req:
        """Send the request with the least progress back to the waiting queue; its KV goes to the tree."""
        victim = min(candidates, key=lambda r: (len(r.output_ids), -r.created))
        self.kv.release(victim)
        running.remove(victim)
        waiting.insert(0, victim)
        self.metrics.retractions += 1
        return victim

    def _prompts_in_progress(self, active: list[Req]) -> RadixCache | None:
        """Prompts being computed but not yet in the tree (in-batch prefix check), or None if disabled."""
        if not self.kv.caching:
            return None
        prompts = RadixCache(None)
        for r in active:
            if r.kv.locked_len < len(r.input_ids) - 1:
                key = r.radix_key(len(r.input_ids))
                prompts.insert(key, torch.zeros(len(key.token_ids), dtype=torch.int64))
        return prompts

    def _ordered(self, waiting: list[Req]) -> list[Req]:
        if self.config.schedule_policy == "fcfs" or len(waiting) > LPM_FALLBACK_QUEUE_LEN or not self.kv.caching:
            return list(waiting)
        scored = [(-self.kv.cached_prefix_len(r), i, r) for i, r in enumerate(waiting)]
        return [r for _, _, r in sorted(scored, key=lambda x: x[:2])]
