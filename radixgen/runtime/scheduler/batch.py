"""ScheduledBatch: one step's requests turned into model inputs; StepOutput: what came back."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from radixgen.radix_cache.memory_pool import ReqToTokenPool
from radixgen.runtime.executor.forward_batch import ForwardBatch, make_forward_batch
from radixgen.runtime.scheduler.request import Req


@dataclass
class ScheduledBatch:
    """The requests of a step, their chunk lengths, and where each one's logits rows are.

    `samples[i]` says whether request i samples a token this step (its chunk completes the
    sequence and it wants output); `sample_rows[i]` is then its row in the logits. Prompt-logprob
    requests also get `input_rows[i]`: logits rows predicting prompt tokens `input_targets[i]`.
    """

    reqs: list[Req]
    extend_lens: list[int]
    forward: ForwardBatch
    samples: list[bool]
    sample_rows: list[int]
    input_rows: list[list[int]]
    input_targets: list[list[int]]
    first_input_none: list[bool]  # the first prompt token's logprob (None) belongs to this step
    prefill_tokens: int  # tokens of this step that are prompt (not decode) tokens
    ready: threading.Event = field(default_factory=threading.Event)  # set once earlier results are processed

    @property
    def sampling_reqs(self) -> list[Req]:
        return [r for r, s in zip(self.reqs, self.samples, strict=True) if s]

    @classmethod
    def build(
        cls, reqs: list[Req], lens: list[int], loc: torch.Tensor, req_pool: ReqToTokenPool
    ) -> ScheduledBatch:
        """Lay out the step: write each chunk's KV slots `loc` into its req_to_token row, collect
        the new tokens (placeholders for tokens still being sampled) and the logits rows wanted."""
        new_tokens: list[list[int]] = []
        rows_per_req: list[list[int]] = []  # offsets within each request's chunk whose logits we need
        samples: list[bool] = []
        input_targets: list[list[int]] = []
        first_none: list[bool] = []
        start = 0
        prefill = sum(n for req, n in zip(reqs, lens, strict=True) if not req.is_decoding)
        for req, n in zip(reqs, lens, strict=True):
            req_pool.write(req.pool_idx, req.kv_len, loc[start : start + n])
            start += n
            tokens = req.token_slice(req.kv_len, req.kv_len + n)
            if len(tokens) < n:  # the input is the token the batch in flight samples: a placeholder
                tokens.append(-(req.pending_ref + 1))
            new_tokens.append(tokens)
            wanted: list[int] = []
            targets: list[int] = []
            if req.return_logprob and req.logprob_start_len >= 0 and not req.output_ids:
                # position p's logits predict prompt token p + 1
                lo = max(req.logprob_start_len - 1, req.kv_len)
                hi = min(req.kv_len + n, len(req.input_ids) - 1)
                wanted = [p - req.kv_len for p in range(lo, hi)]
                targets = req.input_ids[lo + 1 : hi + 1]
            first_none.append(req.return_logprob and req.logprob_start_len == 0 and req.kv_len == 0
                              and not req.output_ids)
            does_sample = req.kv_len + n == req.known_len and req.params.max_new_tokens > 0
            rows_per_req.append(wanted + [n - 1] if does_sample else wanted)
            input_targets.append(targets)
            samples.append(does_sample)
        fb = make_forward_batch(new_tokens, [r.kv_len for r in reqs], [r.pool_idx for r in reqs], loc,
                                rows_per_req, device=req_pool.device_table.device,
                                table_update=req_pool.take_updates())
        n_sampled = 0
        for req, n, does_sample in zip(reqs, lens, samples, strict=True):
            req.kv_len += n
            req.inflight += 1
            if does_sample:
                req.pending += 1
                req.pending_ref, n_sampled = n_sampled, n_sampled + 1
        # absolute logits rows: each request's wanted offsets are laid out one after another
        input_rows, sample_rows, base = [], [], 0
        for wanted, targets, does_sample in zip(rows_per_req, input_targets, samples, strict=True):
            input_rows.append(list(range(base, base + len(targets))))
            sample_rows.append(base + len(wanted) - 1 if does_sample else -1)
            base += len(wanted)
        return cls(reqs, list(lens), fb, samples, sample_rows, input_rows, input_targets, first_none, prefill)


@dataclass
class StepOutput:
    """Per request (in batch order): sampled token, logprobs, prompt logprobs of this step."""

    next_token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[float, int]]]
    input_logprobs: list[list[tuple[float | None, int]]] = field(default_factory=list)
    input_top_logprobs: list[list[list[tuple[float, int]] | None]] = field(default_factory=list)
