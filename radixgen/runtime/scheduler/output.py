"""Output processing: a step's result for one request becomes its progress.

Prompt logprobs are accumulated; a chunk that ends inside the prompt puts its computed KV in the
tree; sampled tokens are appended (a row that verified drafts keeps the drafts equal to its
samples and one sample more; the KV of the rest is dropped), each checked against the stop
conditions (stop token ids and eos, stop strings through the incremental detokenizer, the
grammar's verdict, max_new_tokens, the context length), so nothing past a stop is emitted;
then a jump-forward where the request's grammar forces text, and the new text is streamed.
"""

from __future__ import annotations

from radixgen.runtime.scheduler.batch import ScheduledBatch, StepOutput
from radixgen.runtime.scheduler.jump_forward import plan_jump
from radixgen.runtime.scheduler.kv_manager import KVManager
from radixgen.runtime.scheduler.metrics import SchedulerMetrics
from radixgen.runtime.scheduler.request import CONSTRAINT_UNFOLLOWABLE, FinishReason, Req
from radixgen.runtime.scheduler.speculator import Speculator


class OutputProcessor:
    """Applies step results to requests and emits their output chunks (on the scheduler thread)."""

    def __init__(self, kv: KVManager, metrics: SchedulerMetrics, eos_token_ids: set[int], context_length: int,
                 jump_forward: bool, speculator: Speculator | None = None) -> None:
        self.kv = kv
        self.metrics = metrics
        self.eos_token_ids = eos_token_ids
        self.context_length = context_length
        self.jump_forward = jump_forward
        self.speculator = speculator

    def on_result(self, req: Req, batch: ScheduledBatch, i: int, out: StepOutput,
                  now: float) -> tuple[FinishReason, str] | None:
        """Apply request i's result of `batch`; returns (why, last text) when the request is done."""
        if req.return_logprob:
            req.input_logprobs.extend(out.input_logprobs[i])
            req.input_top_logprobs.extend(out.input_top_logprobs[i])
        if out.pooled and out.pooled[i] is not None:
            req.add_pooled(out.pooled[i])
        if not batch.samples[i]:
            if req.params.max_new_tokens == 0 and req.kv.done_kv_len == len(req.input_ids):
                return FinishReason("length"), ""
            if req.kv.done_kv_len < req.seq_len:  # unfinished chunk: cache what is done
                self.kv.cache_unfinished(req)
            return None
        drafts, sampled = batch.drafts[i], out.sampled[i]
        accepted = 0  # drafts equal to the target's samples (sampled[j] is the token after drafts[:j])
        while accepted < len(sampled) - 1 and sampled[accepted] == drafts[accepted]:
            accepted += 1
        if accepted < len(drafts):  # the KV of rejected drafts goes; a step launched on them is stale
            chunk = batch.extend_lens[i] - len(drafts)
            req.flight.skip = req.flight.batches
            self.kv.truncate(req, batch.starts[i] + chunk + accepted, idle=req.flight.idle)
        before = len(req.output_ids)
        finish, delta = None, ""
        for j, token in enumerate(sampled[: accepted + 1]):
            req.output_ids.append(token)
            if req.return_logprob:
                req.output_logprobs.append((out.logprobs[i][j], token))
                if req.top_logprobs_num:
                    req.output_top_logprobs.append(out.top_logprobs[i][j])
            finish, text = self._check_token(req, token)
            delta += text
            if finish is not None:
                break
        self._on_tokens(req, len(req.output_ids) - before, now)
        if finish is None:
            if batch.extend_lens[i] - len(drafts) > 1 and self.kv.caching:
                self.kv.cache_unfinished(req)  # the prompt is computed: later requests may share it now
            if req.grammar is not None and self.jump_forward and not req.return_logprob:
                delta += self._jump(req)
                if len(req.output_ids) >= req.params.max_new_tokens:
                    finish = FinishReason("length")
        if self.speculator is not None and req.spec is not None:
            self.speculator.on_verified(req, len(drafts), accepted, len(req.output_ids) - before)
        if finish is not None:
            return finish, delta
        if req.stream and delta:
            req.emit({"text": delta, "output_ids": self._new_ids(req), "meta_info": req.meta_info()})
        return None

    def _on_tokens(self, req: Req, n: int, now: float) -> None:
        """Latency metrics for `n` tokens that arrived together (the gap is spread over them)."""
        self.metrics.generated_tokens += n
        if req.first_token_time is None:
            req.first_token_time = now
            self.metrics.on_first_token(now - req.created)
            n, gap = n - 1, 0.0
        else:
            gap = (now - req.last_token_time) / max(n, 1)
        for _ in range(n):
            self.metrics.on_token_gap(gap)
        req.last_token_time = now

    def _check_token(self, req: Req, token: int) -> tuple[FinishReason | None, str]:
        """Whether the output ends with `token` (just appended); the text it adds."""
        p = req.params
        delta = ""
        if req.grammar is not None and not req.grammar.accept_token(token):
            finish = FinishReason("abort", message=f"{CONSTRAINT_UNFOLLOWABLE}: its grammar rejected token {token} it "
                                  "had allowed (a pattern may need bytes no token of this model's vocabulary spells)")
        elif (not p.ignore_eos and token in self.eos_token_ids) or (p.stop_token_ids and token in p.stop_token_ids):
            finish = FinishReason("stop", matched=token)
        else:
            delta = req.detok.add([token])
            finish = None
            if req.detok.stopped:
                finish = FinishReason("stop", matched=req.detok.matched_stop)
            elif req.grammar is not None and req.grammar.is_terminated():
                finish = FinishReason("stop")
        if finish is None and (len(req.output_ids) >= p.max_new_tokens or req.seq_len >= self.context_length):
            finish = FinishReason("length")
        return finish, delta

    def _jump(self, req: Req) -> str:
        """Append the continuation the request's grammar forces; returns the text to emit."""
        jump = plan_jump(req)
        if jump is None:
            return ""
        drop = len(req.output_ids) - jump.keep
        req.output_ids[jump.keep :] = jump.new_tail
        self.metrics.jump_forward_tokens += len(jump.new_tail) - drop
        # KV at and after this position was computed for the replaced tokens; results in flight are stale
        req.flight.skip = req.flight.batches
        self.kv.truncate(req, len(req.input_ids) + jump.keep, idle=req.flight.idle)
        return req.detok.replace_tail(drop, jump.new_tail, jump.text)

    def emit_final(self, req: Req, delta: str = "") -> None:
        """Send the finished request's last chunk (streaming) or its whole output (an embedding
        request's: its embedding)."""
        if req.pooling is not None:
            req.emit({"embedding": req.embedding(), "meta_info": req.meta_info()})
        elif req.stream:
            delta += req.detok.flush()
            req.emit({"text": delta, "output_ids": self._new_ids(req), "meta_info": req.meta_info()})
        else:
            req.detok.flush()
            req.emit({"text": req.detok.output_text, "output_ids": list(req.output_ids),
                      "meta_info": req.meta_info()})

    @staticmethod
    def _new_ids(req: Req) -> list[int]:
        ids = req.output_ids[req.sent_ids :]
        req.sent_ids = len(req.output_ids)
        return ids
