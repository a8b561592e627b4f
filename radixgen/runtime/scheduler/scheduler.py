"""Scheduler: continuous batching over the radix cache, in its own thread.

Every step admits new requests (continuous batching), mixes prefill chunks and decodes in one
ForwardBatch, and keeps a waiting queue ordered by `lpm` (longest cached prefix first) or `fcfs`.
Long prompts are prefilled in chunks under `chunked_prefill_size` tokens a step, the computed part
inserted into the tree between chunks. When decode runs out of KV, the requests with the least
progress are retracted to the waiting queue (their KV goes to the tree) and resumed later.

Overlap schedule: batch N+1 is scheduled and launched on the worker thread before batch N's
results are processed, so the forward pass of N+1 runs while this thread detokenizes, checks stop
conditions, streams and updates the tree for N. A decode input of N+1 that N has not produced yet
is a placeholder the worker resolves from N's sampled ids. N+1 samples only after this thread has
processed N (the batch's `ready` event), so penalties, seeds and grammar bitmasks see every token.
A request that turns out to have finished at N wastes its N+1 slot, which is freed afterwards.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from radixgen.radix_cache.radix_tree import RadixCache
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.executor.worker import ModelWorker
from radixgen.runtime.scheduler.batch import ScheduledBatch, StepOutput
from radixgen.runtime.scheduler.jump_forward import plan_jump
from radixgen.runtime.scheduler.metrics import SchedulerMetrics
from radixgen.runtime.scheduler.request import FinishReason, Req
from radixgen.runtime.threads import serial_torch_on_this_thread

logger = logging.getLogger(__name__)

LPM_FALLBACK_QUEUE_LEN = 128  # past this many waiting requests lpm's matching costs more than it saves
DECODE_RESERVE_TOKENS = 8  # KV kept free per running request when admitting new prefills
IN_BATCH_SHARED_TOKENS = 32  # a waiting request sharing this many uncached tokens with one admitted
# in the same step waits a step, so it reuses that prefix from the tree instead of computing it again


@dataclass
class _Control:
    """A request to the scheduler thread that is not a generation request."""

    op: str
    arg: object = None
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None


class Scheduler:
    """Owns the waiting/running queues, the radix tree and the step loop."""

    def __init__(self, config: EngineConfig, runner: ModelRunner, eos_token_ids: set[int]) -> None:
        self.config = config
        self.runner = runner
        self.eos_token_ids = eos_token_ids
        self.req_pool = runner.req_to_token_pool
        self.kv_pool = runner.token_to_kv_pool
        self.tree = RadixCache(self.kv_pool.allocator, config.page_size, disable=config.disable_radix_cache)
        self.worker = ModelWorker(config, runner, eos_token_ids)
        self.inbox: queue.Queue[Req | _Control] = queue.Queue()
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.metrics = SchedulerMetrics()
        self.context_length = runner.context_length
        self.jump_forward = not config.disable_jump_forward
        self._stop = False
        self.error: Exception | None = None  # what stopped the loop, if an internal error did
        self._thread = threading.Thread(target=self._loop, name="radixgen-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ API (any thread)

    def add_request(self, req: Req) -> None:
        self._put(req)

    def abort(self, rid: str) -> None:
        self._put(_Control("abort", rid), check=False)  # nothing to abort once the loop has failed

    def call(self, op: str, arg: object = None, timeout: float | None = None) -> object:
        """Run a control op ("flush_cache", "stats") on the scheduler thread and wait for it."""
        c = _Control(op, arg)
        self._put(c)
        if not c.done.wait(timeout):
            raise TimeoutError(f"scheduler did not answer {op!r}")
        if isinstance(c.result, Exception):
            raise c.result
        return c.result

    def _error_message(self) -> str:
        return f"the engine stopped after an internal error ({self.error!r}); start a new Engine"

    def _put(self, item: Req | _Control, check: bool = True) -> None:
        """Queue `item` for the loop; once the loop has failed, raise (`check`) or answer it here."""
        if check and self.error is not None:
            raise RuntimeError(self._error_message())
        self.inbox.put(item)
        if self.error is not None:  # the loop failed while this was being queued
            self._fail_inbox()

    def _fail_inbox(self) -> None:
        """Answer everything still queued after the loop failed: requests finish with "abort", control
        calls get the error."""
        message = self._error_message()
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Req):
                item.finished = FinishReason("abort", message=message)
                item.emit({"text": "", "output_ids": [], "meta_info": item.meta_info()})
            else:
                item.result = RuntimeError(message)
                item.done.set()

    def shutdown(self) -> None:
        self._stop = True
        self.inbox.put(_Control("stop"))
        self._thread.join(timeout=30)
        self.worker.shutdown()

    # ------------------------------------------------------------------ loop

    def _loop(self) -> None:
        serial_torch_on_this_thread()  # no OpenMP team here beside the worker's (see runtime/threads.py)
        inflight: tuple[ScheduledBatch, Future[StepOutput]] | None = None
        try:
            while not self._stop:
                self._drain(block=not (self.waiting or self.running or inflight))
                if self._stop:
                    break
                batch = self._schedule(can_retract=inflight is None)
                future = self.worker.submit(batch) if batch is not None else None
                if inflight is not None:
                    self._process(inflight[0], inflight[1].result())
                    inflight = None
                if batch is None:
                    if self.waiting or self.running:
                        time.sleep(0.001)  # nothing fits yet (KV held by running requests)
                    continue
                batch.ready.set()  # the results before this batch are in: it may sample now
                if self.config.disable_overlap:
                    self._process(batch, future.result())
                else:
                    inflight = (batch, future)
            if inflight is not None:
                self._process(inflight[0], inflight[1].result())
        except Exception as e:  # a bug must not hang callers: fail everything in flight and everything later
            self.error = e
            for req in self.running + self.waiting:
                self._finish(req, FinishReason("abort", message=f"internal error: {e!r}"))
            self._fail_inbox()
            logger.exception("the scheduler stopped after an internal error")
            return  # (requests still in flight were finished above, once)
        for req in self.running + self.waiting:
            self._finish(req, FinishReason("abort", message="engine shut down"))

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, Req):
                self.waiting.append(item)
                self.metrics.on_arrival()
            else:
                self._control(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _control(self, c: _Control) -> None:
        try:
            if c.op == "abort":
                for req in self.waiting + self.running:
                    if req.rid == c.arg:
                        req.to_abort = "aborted by client"
            elif c.op == "flush_cache":
                c.result = self._flush_cache()
            elif c.op == "stats":
                c.result = self.stats()
            elif c.op == "stop":
                self._stop = True
        except Exception as e:  # report to the caller
            c.result = e
        c.done.set()

    def _flush_cache(self) -> bool:
        if self.running or self.waiting:  # a finished request stays in running until its KV is released
            return False
        self.tree.reset()
        self.kv_pool.allocator.clear()
        self.req_pool.clear()
        return True

    def stats(self) -> dict:
        cap = self.kv_pool.size
        used = cap - self.kv_pool.available_size()
        return self.metrics.snapshot(
            running=len(self.running),
            waiting=len(self.waiting),
            kv_used=used,
            kv_capacity=cap,
            kv_evictable=self.tree.evictable_size(),
            worker_busy_seconds=self.worker.busy_seconds,
        )

    # ------------------------------------------------------------------ scheduling

    def _available(self) -> int:
        return self.kv_pool.available_size() + self.tree.evictable_size()

    def _alloc(self, n: int) -> torch.Tensor | None:
        short = n - self.kv_pool.available_size()
        if short > 0:
            self.tree.evict(short)
        return self.kv_pool.alloc(n)

    def _schedule(self, can_retract: bool) -> ScheduledBatch | None:
        """Pick this step's requests and chunk lengths; None when nothing can run yet.

        With a batch in flight (`can_retract` False) a KV shortage returns None instead of
        retracting, so the in-flight batch is processed first.
        """
        for req in [r for r in self.waiting + self.running if r.to_abort and not r.finished]:
            self._finish(req, FinishReason("abort", message=req.to_abort))
        active = [r for r in self.running if r.finished is None and not r.skip_results]
        decodes = [r for r in active if r.is_decoding and r.wants_more]
        if self._available() < len(decodes):
            if not can_retract:
                return None
            while decodes and self._available() < len(decodes):
                decodes.remove(self._retract(decodes))
        chunks: dict[int, int] = {id(r): 1 for r in decodes}  # by object: rids come from users
        need, budget = len(decodes), self.config.chunked_prefill_size
        # unfinished chunked prefills first, then new requests
        for req in [r for r in active if not r.is_decoding]:
            n = min(req.extend_len, budget)
            if n <= 0 or need + n > self._available():
                continue
            chunks[id(req)], budget, need = n, budget - n, need + n
        admitted = self._prompts_in_progress(active) if self.waiting else None
        for req in self._ordered_waiting():
            if budget <= 0 or self.req_pool.available_size() == 0:
                break
            if len(self.running) >= self.config.max_running_requests:
                break
            self._match(req)
            if admitted is not None:
                key = req.radix_key(req.prefix_cap())
                if admitted.match_prefix(key).prefix_len - req.kv_len >= IN_BATCH_SHARED_TOKENS:
                    self._unlock(req)
                    continue
                admitted.insert(key, torch.zeros(len(key.token_ids), dtype=torch.int64))
            n = min(req.extend_len, budget)
            reserve = DECODE_RESERVE_TOKENS * len(self.running)
            if need + n > self._available() - reserve and self.running:
                self._unlock(req)
                break
            req.pool_idx = self.req_pool.alloc()
            self.req_pool.write(req.pool_idx, 0, req.prefix_slots)
            self.waiting.remove(req)
            self.running.append(req)
            chunks[id(req)], budget, need = n, budget - n, need + n
        reqs = [r for r in self.running if id(r) in chunks]
        if not reqs:
            return None
        lens = [chunks[id(r)] for r in reqs]
        loc = self._alloc(sum(lens))
        if loc is None:  # a lone request larger than the whole pool
            self._finish(reqs[0], FinishReason("abort", message="KV cache exhausted"))
            return None
        return ScheduledBatch.build(reqs, lens, loc, self.req_pool)

    def _prompts_in_progress(self, active: list[Req]) -> RadixCache | None:
        """Prompts being computed but not yet in the tree (in-batch prefix check), or None if disabled."""
        if self.tree.disable:
            return None
        prompts = RadixCache(None)
        for r in active:
            if r.locked_len < len(r.input_ids) - 1:
                key = r.radix_key(len(r.input_ids))
                prompts.insert(key, torch.zeros(len(key.token_ids), dtype=torch.int64))
        return prompts

    def _ordered_waiting(self) -> list[Req]:
        if self.config.schedule_policy == "fcfs" or len(self.waiting) > LPM_FALLBACK_QUEUE_LEN:
            return list(self.waiting)
        if self.tree.disable:
            return list(self.waiting)
        scored = [(-self.tree.match_prefix(r.radix_key(r.prefix_cap())).prefix_len, i, r)
                  for i, r in enumerate(self.waiting)]
        return [r for _, _, r in sorted(scored, key=lambda x: x[:2])]

    def _match(self, req: Req) -> None:
        m = self.tree.match_prefix(req.radix_key(req.prefix_cap()))
        self.tree.inc_lock_ref(m.last_node)
        req.last_node, req.locked_len = m.last_node, m.prefix_len
        req.kv_len = req.done_kv_len = m.prefix_len
        req.prefix_slots = m.kv_indices
        if not req.output_ids:
            req.cached_tokens = m.prefix_len
            self.metrics.cached_prompt_tokens += m.prefix_len

    def _unlock(self, req: Req) -> None:
        self.tree.dec_lock_ref(req.last_node)
        req.last_node, req.locked_len, req.kv_len, req.done_kv_len = None, 0, 0, 0

    def _retract(self, candidates: list[Req]) -> Req:
        """Send the request with the least progress back to the waiting queue; its KV goes to the tree."""
        victim = min(candidates, key=lambda r: (len(r.output_ids), -r.created))
        self._release(victim)
        victim.kv_len = victim.done_kv_len = 0
        self.running.remove(victim)
        self.waiting.insert(0, victim)
        self.metrics.retractions += 1
        return victim

    def _release(self, req: Req) -> None:
        """Hand the request's KV to the tree (or free it) and give back its request slot."""
        if req in self.running and req.finished is not None:
            self.running.remove(req)
        if req.pool_idx is None:
            if req.last_node is not None:
                self._unlock(req)
            return
        self._truncate_kv(req)  # KV of tokens a jump-forward replaced must not reach the tree
        slots = req.kv_slots(self.req_pool.req_to_token)  # all computed: nothing is in flight
        self.tree.cache_finished_req(req.radix_key(req.kv_len), slots, req.last_node, req.locked_len)
        self.req_pool.free(req.pool_idx)
        req.pool_idx, req.last_node, req.locked_len = None, None, 0

    # ------------------------------------------------------------------ results

    def _process(self, batch: ScheduledBatch, out: StepOutput) -> None:
        now = time.perf_counter()
        for i, req in enumerate(batch.reqs):
            req.inflight -= 1
            req.done_kv_len += batch.extend_lens[i]
            if batch.samples[i]:
                req.pending -= 1
            if req.finished is not None:  # finished at an earlier batch: this step was wasted
                if req.inflight == 0:
                    self._release(req)
                continue
            if req.skip_results:  # its inputs were replaced by a jump-forward
                req.skip_results -= 1
                if req.inflight == 0:
                    self._truncate_kv(req)
                continue
            if req.return_logprob:
                req.input_logprobs.extend(out.input_logprobs[i])
                req.input_top_logprobs.extend(out.input_top_logprobs[i])
            if not batch.samples[i]:
                if req.params.max_new_tokens == 0 and req.done_kv_len == len(req.input_ids):
                    self._finish(req, FinishReason("length", matched=None))
                elif req.done_kv_len < req.seq_len:  # unfinished chunk: cache what is done
                    self._cache_unfinished(req)
                continue
            if batch.extend_lens[i] > 1 and not self.tree.disable:
                self._cache_unfinished(req)  # the prompt is computed: later requests may share it now
            token = out.next_token_ids[i]
            req.output_ids.append(token)
            self.metrics.generated_tokens += 1
            if req.first_token_time is None:
                req.first_token_time = now
                self.metrics.on_first_token(now - req.created)
            elif req.last_token_time is not None:
                self.metrics.on_token_gap(now - req.last_token_time)
            req.last_token_time = now
            if req.return_logprob:
                req.output_logprobs.append((out.logprobs[i], token))
                if req.top_logprobs_num:
                    req.output_top_logprobs.append(out.top_logprobs[i])
            self._check_finish(req, token)
        self.metrics.prompt_tokens += batch.prefill_tokens
        self.metrics.forward_steps += 1

    def _cache_unfinished(self, req: Req) -> None:
        done = req.done_kv_len  # a later chunk may be in flight: insert only computed KV
        slots = self.req_pool.req_to_token[req.pool_idx, :done].clone()
        new_slots, node = self.tree.cache_unfinished_req(req.radix_key(done), slots, req.last_node, req.locked_len)
        self.req_pool.write(req.pool_idx, 0, new_slots)
        if not self.tree.disable:
            req.last_node = node
            req.locked_len = done // self.config.page_size * self.config.page_size

    def _check_finish(self, req: Req, token: int) -> None:
        p = req.params
        stop_ids = set(p.stop_token_ids or ())
        if not p.ignore_eos:
            stop_ids |= self.eos_token_ids
        delta = ""
        if req.grammar is not None and not req.grammar.accept_token(token):
            finish = FinishReason("abort", message=f"token {token} violates the request's constraint")
        elif token in stop_ids:
            finish = FinishReason("stop", matched=token)
        else:
            delta = req.detok.add([token])
            finish = None
            if req.detok.stopped:
                finish = FinishReason("stop", matched=req.detok.matched_stop)
            elif req.grammar is not None and req.grammar.is_terminated():
                finish = FinishReason("stop", matched=None)
        if finish is None and len(req.output_ids) >= p.max_new_tokens:
            finish = FinishReason("length", matched=None)
        if finish is None and req.seq_len >= self.context_length:
            finish = FinishReason("length", matched=None)
        if finish is None and req.grammar is not None and self.jump_forward and not req.return_logprob:
            delta += self._jump(req)
            if len(req.output_ids) >= p.max_new_tokens:
                finish = FinishReason("length", matched=None)
        if finish is not None:
            self._finish(req, finish, delta)
        elif req.stream and delta:
            req.emit({"text": delta, "output_ids": self._new_ids(req), "meta_info": req.meta_info()})

    def _jump(self, req: Req) -> str:
        """Append the continuation the request's grammar forces; returns the text to emit."""
        jump = plan_jump(req)
        if jump is None:
            return ""
        drop = len(req.output_ids) - jump.keep
        req.output_ids[jump.keep :] = jump.new_tail
        self.metrics.jump_forward_tokens += len(jump.new_tail) - drop
        stale_from = len(req.input_ids) + jump.keep  # KV at and after this position was for old tokens
        req.kv_truncate = min(req.kv_len, stale_from)
        req.skip_results = req.inflight
        if req.inflight == 0:
            self._truncate_kv(req)
        return req.detok.replace_tail(drop, jump.new_tail, jump.text)

    def _truncate_kv(self, req: Req) -> None:
        """Drop KV computed for tokens a jump-forward replaced (nothing of the request is in flight)."""
        target = req.kv_truncate
        if target is not None and target < req.kv_len:
            self.kv_pool.free(self.req_pool.req_to_token[req.pool_idx, target : req.kv_len].clone())
            req.kv_len = req.done_kv_len = target
        req.kv_truncate = None

    @staticmethod
    def _new_ids(req: Req) -> list[int]:
        ids = req.output_ids[req.sent_ids :]
        req.sent_ids = len(req.output_ids)
        return ids

    def _finish(self, req: Req, reason: FinishReason, delta: str = "") -> None:
        req.finished = reason
        if req in self.waiting:
            self.waiting.remove(req)
        if req.inflight == 0:  # else released once its last in-flight batch is processed
            self._release(req)
        self.metrics.on_finish()
        if req.stream:
            delta += req.detok.flush()
            req.emit({"text": delta, "output_ids": self._new_ids(req), "meta_info": req.meta_info()})
        else:
            req.detok.flush()
            req.emit({"text": req.detok.output_text, "output_ids": list(req.output_ids),
                      "meta_info": req.meta_info()})

