"""ModelWorker: model forward + sampling for ScheduledBatches, on its own thread.

The worker turns the scheduler's batch into logits (ModelRunner), prompt logprobs where asked,
and sampled tokens (Sampler: grammar bitmask, penalties, temperature, top-k/p, min-p, seeds).
Batches run in submission order. A decode input may be a placeholder `-(i + 1)`: the i-th token
sampled by the previous batch, resolved here (future token ids of the overlap schedule). Sampling
waits for the batch's `ready` event, which the scheduler sets once it has processed the earlier
results, so penalties, RNG steps and grammar bitmasks are up to date.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import torch

from radixgen.common.transfer import to_device
from radixgen.grammar.base import allocate_bitmask
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.scheduler.batch import ScheduledBatch, StepOutput
from radixgen.sampling.sampler import Sampler
from radixgen.sampling.torch_ops import SamplingBatch


def _top_list(values: torch.Tensor, ids: torch.Tensor) -> list[list[tuple[float, int]]]:
    return [list(zip(v, i, strict=True)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]


class ModelWorker:
    """Runs forward passes and sampling for the scheduler."""

    def __init__(self, config: EngineConfig, runner: ModelRunner, eos_token_ids: set[int]) -> None:
        self.runner = runner
        self.eos_token_ids = sorted(eos_token_ids)
        self.sampler = Sampler(config.sampling_backend, runner.device)
        self._last_ids: torch.Tensor | None = None  # [S] tokens sampled by the previous batch
        self.busy_seconds = 0.0  # time spent on batches, waits for `ready` excluded (written by this thread)
        self._queue: queue.Queue[tuple[ScheduledBatch, Future] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="radixgen-worker", daemon=True)
        self._thread.start()

    def submit(self, batch: ScheduledBatch) -> Future[StepOutput]:
        """Queue a batch; the Future resolves to its StepOutput."""
        fut: Future[StepOutput] = Future()
        self._queue.put((batch, fut))
        return fut

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            batch, fut = item
            try:
                fut.set_result(self.run(batch))
            except Exception as e:  # surfaces on the scheduler thread
                fut.set_exception(e)

    def run(self, batch: ScheduledBatch) -> StepOutput:
        fb = batch.forward
        if fb.has_placeholders and self._last_ids is not None:
            prev = self._last_ids[(-fb.input_ids - 1).clamp(min=0)]  # [T]
            fb.input_ids = torch.where(fb.input_ids < 0, prev, fb.input_ids)
        start = time.perf_counter()
        logits = self.runner.forward(fb)  # [L, V] float32
        out = StepOutput([-1] * len(batch.reqs), [None] * len(batch.reqs), [[] for _ in batch.reqs])
        self._prompt_logprobs(batch, logits, out)
        waiting = time.perf_counter()
        batch.ready.wait()
        resumed = time.perf_counter()
        self._sample(batch, logits, out)
        self.busy_seconds += time.perf_counter() - resumed + waiting - start
        return out

    def _sample(self, batch: ScheduledBatch, logits: torch.Tensor, out: StepOutput) -> None:
        """Sample the batch's sampling rows into `out` (and remember them for placeholders)."""
        idx = [i for i, s in enumerate(batch.samples) if s]
        if not idx:
            self._last_ids = None
            return
        reqs = [batch.reqs[i] for i in idx]
        rows = logits[[batch.sample_rows[i] for i in idx]]  # [S, V]
        sb = SamplingBatch.build([r.params for r in reqs], [r.output_ids for r in reqs], [r.seed for r in reqs],
                                 self.runner.vocab_size, self.eos_token_ids, self.runner.device)
        res = self.sampler(rows, sb, self._grammar_bitmask(reqs))
        self._last_ids = res.next_token_ids
        tokens = res.next_token_ids.tolist()
        lps = res.logprobs.tolist() if res.logprobs is not None else [None] * len(idx)
        tops = (_top_list(res.top_logprob_values, res.top_logprob_ids)
                if res.top_logprob_ids is not None else [[] for _ in idx])
        for j, i in enumerate(idx):
            out.next_token_ids[i], out.logprobs[i] = tokens[j], lps[j]
            out.top_logprobs[i] = tops[j][: batch.reqs[i].top_logprobs_num]

    def _grammar_bitmask(self, reqs: list) -> torch.Tensor | None:
        """int32 [S, ceil(V/32)] allowed-token bits of constrained rows (others all ones), or None."""
        if all(r.grammar is None for r in reqs):
            return None
        bitmask = allocate_bitmask(len(reqs), self.runner.vocab_size)
        for row, req in enumerate(reqs):
            if req.grammar is not None:
                if req.params.budget_aware:  # tokens it may still emit, this one included
                    req.grammar.set_budget(req.params.max_new_tokens - len(req.output_ids))
                req.grammar.fill_bitmask(bitmask, row)
        return to_device(bitmask, self.runner.device)

    def _prompt_logprobs(self, batch: ScheduledBatch, logits: torch.Tensor, out: StepOutput) -> None:
        out.input_logprobs = [[] for _ in batch.reqs]
        out.input_top_logprobs = [[] for _ in batch.reqs]
        for i, req in enumerate(batch.reqs):
            if not req.return_logprob:
                continue
            if batch.first_input_none[i]:
                out.input_logprobs[i].append((None, req.input_ids[0]))
                out.input_top_logprobs[i].append(None)
            if not batch.input_targets[i]:
                continue
            lp = torch.log_softmax(logits[batch.input_rows[i]], dim=-1)  # [n, V]
            tgt = to_device(torch.tensor(batch.input_targets[i]), logits.device)  # [n]
            vals = lp.gather(1, tgt[:, None])[:, 0].tolist()
            out.input_logprobs[i].extend(zip(vals, batch.input_targets[i], strict=True))
            if req.top_logprobs_num:
                top = lp.topk(req.top_logprobs_num, dim=-1)
                out.input_top_logprobs[i].extend(_top_list(top.values, top.indices))
            else:
                out.input_top_logprobs[i].extend([None] * len(vals))

    def shutdown(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
