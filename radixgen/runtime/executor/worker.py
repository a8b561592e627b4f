"""ModelWorker: model forward + sampling for ScheduledBatches, on its own thread.

The worker turns the scheduler's batch into logits (ModelRunner), prompt logprobs where asked,
and sampled tokens (Sampler: grammar bitmask, penalties, temperature, top-k/p, min-p, seeds).
Batches run in submission order. A decode input may be a placeholder `-(i + 1)`: the token the
previous batch sampled last for its i-th sampling request, resolved here (future token ids of the
overlap schedule). Sampling (and prompt logprobs) waits for the batch's `ready` event, which the
scheduler sets once it has processed the earlier results, so penalties, RNG steps and grammar
bitmasks are up to date.

On an asynchronous device (CUDA: `read_results_apart`) a batch's results are copied to pinned host
memory behind an event and read on a second thread, which waits for that event and resolves the
batch's future; this thread goes straight on to the next batch and queues its forward. The device
then runs batch N + 1's forward while the host reads N's results, processes them and schedules
N + 2. Read here, each step's host work left the device idle (a 1B Llama on an H200, batch 1:
2.9 ms a step, of which the forward needs well under 1 ms).

On the CPU, where this thread runs the forward itself, batch N's results are held while batch N + 1
(already queued) sets up its step, and delivered once its kernels start (`ForwardBatch.before_kernels`):
the scheduler then processes N and schedules N + 2 while the kernels run, not while N + 1's own Python
runs, which it slowed by taking the GIL at each of its torch ops (an in-process A/B on 2 cores:
SmolLM2-135M batch-1 decode 1.06-1.09x, Gemma 3 270M 1.03x). With nothing queued, results go at once:
the scheduler is waiting for them to build the next batch.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from radixgen.common.transfer import to_device
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.executor.sampling_rows import SamplingRows
from radixgen.runtime.kernels.sampler_kernels import cpu_sampler_kernels
from radixgen.runtime.scheduler.batch import ScheduledBatch, StepOutput
from radixgen.runtime.threads import torch_threads_on_this_thread
from radixgen.sampling.sampler import Sampler
from radixgen.sampling.torch_ops import SamplingBatch


def _top_list(values: torch.Tensor, ids: torch.Tensor) -> list[list[tuple[float, int]]]:
    return [list(zip(v, i, strict=True)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]


@dataclass
class _Results:
    """A batch whose sampling is queued: its results' host copies (None: nothing sampled) and the
    device event after which they are complete (None: on the host already)."""

    batch: ScheduledBatch
    out: StepOutput
    rows: SamplingRows
    tensors: tuple[torch.Tensor | None, ...] | None  # token ids, logprobs, top logprob values and ids
    copied: torch.cuda.Event | None


class ModelWorker:
    """Runs forward passes and sampling for the scheduler."""

    def __init__(self, config: EngineConfig, runner: ModelRunner, eos_token_ids: set[int]) -> None:
        self.runner = runner
        self.eos_token_ids = sorted(eos_token_ids)
        self.sampler = Sampler(config.sampling_backend, runner.device,  # on CPU some of its steps in C
                               kernels=cpu_sampler_kernels() if runner.device.type == "cpu" else None)
        self._last_ids: torch.Tensor | None = None  # [S] tokens sampled by the previous batch
        # rows up to which a pure-decode step keeps the one-call C path (None: the model has none); the
        # speculator keeps verifying steps within it
        self.fast_decode_rows: int | None = runner.model.one_call_rows
        # On a model whose matrices run in the C kernels (up to `block_rows_limit()` rows on the vector
        # paths, any number on AMX, or in a step without a long chunk where those take bfloat16 GEMMs), a
        # step's torch ops (sampling on [B, V] logits, residual adds, prefill attention) run serially on
        # this thread unless attention is a large share of the step (`StepPlan.serial_torch`,
        # executor/step_plan.py). Run in parallel, each left torch's OpenMP worker spinning for the rest of the
        # step on the core the C kernels' worker needs: the kernel pool then mostly ran alone (SmolLM2
        # batch 16 on 2 cores: 36-41 ms a step before, 34-37 ms after; 31-34 ms with
        # OMP_WAIT_POLICY=PASSIVE). Other steps run matrices as oneDNN GEMMs, which need the team:
        # serial, they ran on one core (AMD Zen 4, no AMX: prefill of 256 tokens 394-413 ->
        # 621-721 tok/s, batch-64 decode 241-260 -> 364-407 tok/s once they got it back).
        self.torch_team = torch.get_num_threads()  # what a step's torch ops run on where it is not serial
        self.torch_threads_now = self.torch_team  # what torch ops on this thread run on now
        # host time launching and sampling batches (on CPU the forward itself), waits for `ready` excluded
        self.busy_seconds = 0.0  # (written by this thread alone)
        # Results read on their own thread (see the module docstring); on by default where the device runs
        # asynchronously to the host
        self.read_results_apart = runner.device.type == "cuda"
        self._queue: queue.Queue[tuple[ScheduledBatch, Future] | None] = queue.Queue()
        self._results: queue.Queue[tuple[_Results, Future] | None] | None = None  # the reader's queue
        self._reader: threading.Thread | None = None
        self._thread = threading.Thread(target=self._loop, name="radixgen-worker", daemon=True)
        self._thread.start()

    def submit(self, batch: ScheduledBatch) -> Future[StepOutput]:
        """Queue a batch; the Future resolves to its StepOutput."""
        fut: Future[StepOutput] = Future()
        self._queue.put((batch, fut))
        return fut

    def _loop(self) -> None:
        held: tuple[_Results, Future] | None = None  # the last batch's results, for the next one's kernel start
        while (item := self._queue.get()) is not None:
            batch, fut = item
            if held is not None:
                batch.forward.before_kernels = functools.partial(self._deliver, *held)
                held = None
            try:
                logits = self._launch(batch)
            except Exception as e:  # surfaces on the scheduler thread
                fut.set_exception(e)
                continue
            finally:  # (where the forward did not: it failed, or took no hook) before sampling waits on it
                batch.forward.kernels_start()
            try:
                results = self._sample(batch, logits)
            except Exception as e:  # surfaces on the scheduler thread
                fut.set_exception(e)
                continue
            if self.read_results_apart:
                self._start_reader()
                self._results.put((results, fut))
            elif self._queue.empty():
                self._deliver(results, fut)
            else:
                held = (results, fut)
        if held is not None:
            self._deliver(*held)
        if self._results is not None:
            self._results.put(None)

    def _start_reader(self) -> None:
        if self._reader is None:
            self._results = queue.Queue()
            self._reader = threading.Thread(target=self._read_loop, name="radixgen-results", daemon=True)
            self._reader.start()

    def _read_loop(self) -> None:
        while (item := self._results.get()) is not None:
            self._deliver(*item)

    def _deliver(self, results: _Results, fut: Future) -> None:
        try:
            fut.set_result(self._read(results))
        except Exception as e:  # surfaces on the scheduler thread
            fut.set_exception(e)

    def _launch(self, batch: ScheduledBatch) -> torch.Tensor:
        """Resolve the batch's placeholders and queue its forward (on CPU: run it); returns the logits
        [L, V] float32."""
        fb = batch.forward
        if fb.has_placeholders and self._last_ids is not None:
            if fb.all_placeholders and self._last_ids.shape[0] == fb.input_ids.shape[0]:
                fb.input_ids = self._last_ids  # a decode step of the last one's requests, in order: no tensor op
            else:
                prev = self._last_ids[(-fb.input_ids - 1).clamp(min=0)]  # [T]
                fb.input_ids = torch.where(fb.input_ids < 0, prev, fb.input_ids)
        plan = self.runner.plan(fb)
        self._set_torch_threads(1 if plan.serial_torch else self.torch_team)
        start = time.perf_counter()
        logits = self.runner.forward(fb, plan)
        self.busy_seconds += time.perf_counter() - start
        return logits

    def _set_torch_threads(self, n: int) -> None:
        if n != self.torch_threads_now:
            torch_threads_on_this_thread(n)
            self.torch_threads_now = n

    def _sample(self, batch: ScheduledBatch, logits: torch.Tensor) -> _Results:
        """Once the batch may sample (its `ready` event), queue its prompt logprobs and the sampling of
        its sampling rows (one per request, more for one verifying drafts: `sampling_rows.py`), remember
        each request's last one for placeholders, and start the results' copy to the host."""
        out = StepOutput([[] for _ in batch.reqs], [[] for _ in batch.reqs], [[] for _ in batch.reqs])
        batch.ready.wait()
        start = time.perf_counter()
        self._prompt_logprobs(batch, logits, out)
        self._pooled(batch, out)
        rows = SamplingRows.build(batch, self.runner.vocab_size)
        if not rows.requests:
            self._last_ids = None
            return _Results(batch, out, rows, None, None)
        sb = SamplingBatch.build(rows.params, rows.output_ids, rows.seeds, self.runner.vocab_size,
                                 self.eos_token_ids, self.runner.device)
        bitmask = to_device(rows.bitmask, self.runner.device) if rows.bitmask is not None else None
        # every row a sampling row, in order (decode steps): the sampler reads the step's logits, no copy
        every_row = rows.logits_rows == list(range(logits.shape[0]))
        res = self.sampler(logits if every_row else logits[rows.logits_rows], sb, bitmask)  # [S] from [S, V]
        last = rows.last_rows
        self._last_ids = res.next_token_ids[last] if len(last) < len(rows.params) else res.next_token_ids
        tensors = (res.next_token_ids, res.logprobs, res.top_logprob_values, res.top_logprob_ids)
        copied = None
        if self.runner.device.type == "cuda":  # copy to pinned host memory without waiting on the device
            tensors = tuple(t.to("cpu", non_blocking=True) if t is not None else None for t in tensors)
            copied = torch.cuda.Event()
            copied.record()
        self.busy_seconds += time.perf_counter() - start
        return _Results(batch, out, rows, tensors, copied)

    def _read(self, results: _Results) -> StepOutput:
        """The sampled tokens and logprobs, per request, from the host copies."""
        out, rows = results.out, results.rows
        if results.tensors is None:
            return out
        if results.copied is not None:
            results.copied.synchronize()
        ids, logprobs, top_values, top_ids = results.tensors
        tokens = ids.tolist()
        lps = logprobs.tolist() if logprobs is not None else [None] * len(tokens)
        tops = _top_list(top_values, top_ids) if top_ids is not None else [[] for _ in tokens]
        start = 0
        for i, count in zip(rows.requests, rows.counts, strict=True):
            end = start + count
            k = results.batch.reqs[i].top_logprobs_num
            out.sampled[i], out.logprobs[i] = tokens[start:end], lps[start:end]
            out.top_logprobs[i] = [t[:k] for t in tops[start:end]]
            start = end
        return out

    @staticmethod
    def _pooled(batch: ScheduledBatch, out: StepOutput) -> None:
        """Each embedding request's sum of its pooled rows of this step's final hidden states."""
        hidden = batch.forward.hidden_out  # [H, hidden] or None
        out.pooled = [None] * len(batch.reqs)
        if hidden is None:
            return
        start = 0
        for i, n in enumerate(batch.hidden_counts):
            if n:
                out.pooled[i] = hidden[start : start + n].sum(0)  # [hidden]
                start += n

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
        if self._reader is not None:
            self._reader.join(timeout=30)
