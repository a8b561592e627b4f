"""ScheduledBatch: one step's requests laid out as model inputs; StepOutput: what came back.

Building a batch is pure: it reads the requests (their tokens, KV lengths before the step and
sampled-but-unseen tokens) and the KV slots the KV manager allocated, and changes nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from radixgen.radix_cache.memory_pool import TableUpdate
from radixgen.runtime.executor.forward_batch import ForwardBatch, make_forward_batch
from radixgen.runtime.scheduler.request import Req


@dataclass
class ScheduledBatch:
    """The requests of a step, their chunk lengths, and where each one's logits rows are.

    `samples[i]` says whether request i samples a token this step (its chunk completes the
    sequence and it wants output); `sample_rows[i]` is then its row in the logits and
    `sample_refs[i]` its index among the step's sampled tokens. Prompt-logprob requests also get
    `input_rows[i]`: logits rows predicting prompt tokens `input_targets[i]`.
    """

    reqs: list[Req]
    extend_lens: list[int]
    forward: ForwardBatch
    samples: list[bool]
    sample_rows: list[int]
    sample_refs: list[int]
    input_rows: list[list[int]]
    input_targets: list[list[int]]
    first_input_none: list[bool]  # the first prompt token's logprob (None) belongs to this step
    prefill_tokens: int  # tokens of this step that are prompt (not decode) tokens
    ready: threading.Event = field(default_factory=threading.Event)  # set once earlier results are processed

    @classmethod
    def build(cls, reqs: list[Req], lens: list[int], starts: list[int], loc: torch.Tensor,
              table_update: TableUpdate | None, device: torch.device) -> ScheduledBatch:
        """Lay out the step: request i computes tokens starts[i] .. starts[i] + lens[i] of its
        sequence into KV slots `loc` (concatenated); inputs that the batch in flight is still
        sampling become placeholders; collect the logits rows wanted."""
        new_tokens: list[list[int]] = []
        rows_per_req: list[list[int]] = []  # offsets within each request's chunk whose logits we need
        samples: list[bool] = []
        input_targets: list[list[int]] = []
        first_none: list[bool] = []
        prefill = 0
        for req, start, n in zip(reqs, starts, lens, strict=True):
            if not req.is_decode_from(start):
                prefill += n
            tokens = req.token_slice(start, start + n)
            if len(tokens) < n:  # the input is the token the batch in flight samples: a placeholder
                tokens.append(-(req.flight.pending_ref + 1))
            new_tokens.append(tokens)
            wanted: list[int] = []
            targets: list[int] = []
            if req.wants_prompt_logprobs:
                # position p's logits predict prompt token p + 1
                lo = max(req.logprob_start_len - 1, start)
                hi = min(start + n, len(req.input_ids) - 1)
                wanted = [p - start for p in range(lo, hi)]
                targets = req.input_ids[lo + 1 : hi + 1]
            first_none.append(req.return_logprob and req.logprob_start_len == 0 and start == 0
                              and not req.output_ids)
            does_sample = start + n == req.known_len and req.params.max_new_tokens > 0
            rows_per_req.append(wanted + [n - 1] if does_sample else wanted)
            input_targets.append(targets)
            samples.append(does_sample)
        fb = make_forward_batch(new_tokens, starts, [r.kv.pool_idx for r in reqs], loc, rows_per_req,
                                device=device, table_update=table_update)
        # absolute logits rows: each request's wanted offsets are laid out one after another
        input_rows, sample_rows, sample_refs, base, n_sampled = [], [], [], 0, 0
        for wanted, targets, does_sample in zip(rows_per_req, input_targets, samples, strict=True):
            input_rows.append(list(range(base, base + len(targets))))
            sample_rows.append(base + len(wanted) - 1 if does_sample else -1)
            sample_refs.append(n_sampled if does_sample else -1)
            n_sampled += does_sample
            base += len(wanted)
        return cls(reqs, list(lens), fb, samples, sample_rows, sample_refs, input_rows, input_targets, first_none,
                   prefill)


@dataclass
class StepOutput:
    """Per request (in batch order): sampled token, logprobs, prompt logprobs of this step."""

    next_token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[float, int]]]
    input_logprobs: list[list[tuple[float | None, int]]] = field(default_factory=list)
    input_top_logprobs: list[list[list[tuple[float, int]] | None]] = field(default_factory=list)
