"""ScheduledBatch: one step's requests laid out as model inputs; StepOutput: what came back.

Building a batch is pure: it reads the requests (their tokens, KV lengths before the step and
sampled-but-unseen tokens), the KV slots the KV manager allocated and the step's drafts, and
changes nothing.

A request verifying drafts d_1..d_k computes its chunk (ending with its last token) and then each
draft as its own one-token row at the next position: every row of the forward is then an
ordinary extend or decode row, and a verifying decode is k + 1 decode rows of one request (the
rows' K/V are all stored before any row attends, so each draft row sees the rows before it).
On CPU a pure-decode step with drafts thus keeps the one-call C decode path, and a row's logits
are computed by the very kernels a plain decode uses. Its logits rows are the chunk's last
(predicting d_1) and one per draft (the last predicting the token after d_k).
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

    `samples[i]` says whether request i samples this step (its chunk completes the sequence and it
    wants output); its sampling rows are then logits rows `sample_rows[i]` .. `sample_rows[i] +
    len(drafts[i])` (one per verified draft, plus one), and `sample_refs[i]` its index among the
    step's sampling requests (a later placeholder's reference). `extend_lens[i]` counts the
    request's new KV, drafts included. Prompt-logprob requests also get `input_rows[i]`: logits
    rows predicting prompt tokens `input_targets[i]`. An embedding request pools `hidden_counts[i]`
    rows of the step's final hidden states (`forward.hidden_out`, laid out request after request).
    """

    reqs: list[Req]
    extend_lens: list[int]
    starts: list[int]  # each request's KV length before the step
    drafts: list[list[int]]
    hold: list[bool]  # a request verifying drafts waits for the result before its next step
    forward: ForwardBatch
    samples: list[bool]
    sample_rows: list[int]
    sample_refs: list[int]
    input_rows: list[list[int]]
    input_targets: list[list[int]]
    first_input_none: list[bool]  # the first prompt token's logprob (None) belongs to this step
    prefill_tokens: int  # tokens of this step that are prompt (not decode) tokens
    hidden_counts: list[int]  # rows of `forward.hidden_out` each request pools (embedding requests)
    ready: threading.Event = field(default_factory=threading.Event)  # set once earlier results are processed
    worker_busy: float | None = None  # the worker's busy seconds when this result was ready (speculator's timing)

    @classmethod
    def build(cls, reqs: list[Req], lens: list[int], starts: list[int], loc: torch.Tensor,
              table_update: TableUpdate | None, device: torch.device,
              drafts: list[list[int]] | None = None, hold: list[bool] | None = None) -> ScheduledBatch:
        """Lay out the step: request i computes tokens starts[i] .. starts[i] + lens[i] of its
        sequence into KV slots `loc` (concatenated), the last len(drafts[i]) of them its drafts;
        inputs that the batch in flight is still sampling become placeholders; collect the logits
        rows wanted."""
        drafts = drafts if drafts is not None else [[] for _ in reqs]
        hold = hold if hold is not None else [False] * len(reqs)
        row_tokens: list[list[int]] = []  # the forward's rows: a chunk, then one row per draft
        row_starts: list[int] = []
        row_pools: list[int] = []
        row_logits: list[list[int]] = []  # offsets within each row whose logits we need
        row_hidden: list[list[int]] = []  # offsets within each row whose final hidden states we need
        wanted_per_req: list[int] = []
        samples: list[bool] = []
        input_targets: list[list[int]] = []
        first_none: list[bool] = []
        prefill = 0
        for req, start, n, d in zip(reqs, starts, lens, drafts, strict=True):
            chunk = n - len(d)
            if not req.is_decode_from(start):
                prefill += chunk
            tokens = req.token_slice(start, start + chunk)
            if len(tokens) < chunk:  # the input is the token the batch in flight samples: a placeholder
                tokens.append(-(req.flight.pending_ref + 1))
            wanted: list[int] = []
            targets: list[int] = []
            if req.wants_prompt_logprobs:
                # position p's logits predict prompt token p + 1
                lo = max(req.logprob_start_len - 1, start)
                hi = min(start + chunk, len(req.input_ids) - 1)
                wanted = [p - start for p in range(lo, hi)]
                targets = req.input_ids[lo + 1 : hi + 1]
            first_none.append(req.return_logprob and req.logprob_start_len == 0 and start == 0
                              and not req.output_ids)
            does_sample = start + chunk == req.known_len and req.params.max_new_tokens > 0
            row_tokens.append(tokens)
            row_starts.append(start)
            row_pools.append(req.kv.pool_idx)
            row_logits.append(wanted + [chunk - 1] if does_sample else wanted)
            row_hidden.append(req.hidden_rows(start, chunk) if req.pooling is not None else [])
            for j, tok in enumerate(d):
                row_tokens.append([tok])
                row_starts.append(start + chunk + j)
                row_pools.append(req.kv.pool_idx)
                row_logits.append([0])
                row_hidden.append([])
            wanted_per_req.append(len(wanted) + (1 + len(d) if does_sample else 0))
            input_targets.append(targets)
            samples.append(does_sample)
        fb = make_forward_batch(row_tokens, row_starts, row_pools, loc, row_logits, device=device,
                                table_update=table_update, hidden_rows=row_hidden)
        # absolute logits rows: each request's wanted rows are laid out one after another
        input_rows, sample_rows, sample_refs, base, n_sampled = [], [], [], 0, 0
        for n_wanted, targets, does_sample in zip(wanted_per_req, input_targets, samples, strict=True):
            input_rows.append(list(range(base, base + len(targets))))
            sample_rows.append(base + len(targets) if does_sample else -1)
            sample_refs.append(n_sampled if does_sample else -1)
            n_sampled += does_sample
            base += n_wanted
        hidden_counts = [len(req.hidden_rows(start, n)) if req.pooling is not None else 0
                         for req, start, n in zip(reqs, starts, lens, strict=True)]
        return cls(reqs, list(lens), list(starts), drafts, hold, fb, samples, sample_rows, sample_refs, input_rows,
                   input_targets, first_none, prefill, hidden_counts)


@dataclass
class StepOutput:
    """Per request (in batch order): the tokens sampled at its sampling rows (one, or one per
    verified draft plus one: the request keeps the drafts that equal them, then one more), their
    logprobs and top logprobs, and its prompt logprobs of this step."""

    sampled: list[list[int]]
    logprobs: list[list[float | None]]
    top_logprobs: list[list[list[tuple[float, int]]]]
    input_logprobs: list[list[tuple[float | None, int]]] = field(default_factory=list)
    input_top_logprobs: list[list[list[tuple[float, int]] | None]] = field(default_factory=list)
    pooled: list[torch.Tensor | None] = field(default_factory=list)  # [hidden] sums of each request's pooled rows
