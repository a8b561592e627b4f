"""The logits rows a step samples, and what each row samples with (speculative verification).

A request without drafts samples one row. A request verifying drafts d_1..d_k samples up to k + 1
rows: row j is sampled as the request's next token after d_1..d_j, so its penalties count those
drafts, its RNG counter is the step of that output position, and its grammar bitmask is the
matcher's after accepting them (the matcher is advanced over the drafts to fill the masks, then
rolled back: the output processor advances it over what is accepted). Drafts are cut at the
first one the grammar rejects: its row and those after it are not sampled, and the row before
it cannot sample it.

The scheduler keeps the drafts that equal the rows' samples and then the next sample. With a
fixed-token draft this is the standard speculative-sampling rule (accept d with probability
min(1, p(d) / q(d)) = p(d), else sample from (p - q)+, which is p without d): a row's sample is
drawn from the target distribution with that position's own (seed, step) uniform, so the output
has exactly the distribution of plain sampling and, for seeded requests, the very tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixgen.grammar.base import Grammar, allocate_bitmask
from radixgen.runtime.scheduler.batch import ScheduledBatch
from radixgen.sampling.params import SamplingParams


@dataclass
class SamplingRows:
    """Rows to sample, flattened over the step's sampling requests (in batch order)."""

    requests: list[int]  # batch index of each sampling request
    counts: list[int]  # rows sampled per sampling request (1 + drafts checked)
    logits_rows: list[int]  # [S] row of the step's logits for each sampled row
    params: list[SamplingParams]  # [S]
    output_ids: list[list[int]]  # [S] output so far at each row (with the drafts before it)
    seeds: list[int]  # [S]
    bitmask: torch.Tensor | None  # int32 [S, ceil(V / 32)] where any request is constrained

    @property
    def last_rows(self) -> list[int]:
        """Each sampling request's last row (the token a later step's placeholder may stand for)."""
        out, end = [], 0
        for c in self.counts:
            end += c
            out.append(end - 1)
        return out

    @classmethod
    def build(cls, batch: ScheduledBatch, vocab_size: int) -> SamplingRows:
        """Call after the batch's `ready` event (the requests' outputs and grammars are current)."""
        rows = cls([], [], [], [], [], [], None)
        masks: list[tuple[int, torch.Tensor]] = []  # (first row, the request's rows of the bitmask)
        for i, req in enumerate(batch.reqs):
            if not batch.samples[i]:
                continue
            drafts = batch.drafts[i]
            if req.grammar is not None:
                budget = req.params.max_new_tokens - len(req.output_ids) if req.params.budget_aware else None
                mask, n = _grammar_masks(req.grammar, drafts, vocab_size, budget)
                drafts = drafts[:n]
                masks.append((len(rows.params), mask))
            rows.requests.append(i)
            rows.counts.append(1 + len(drafts))
            for j in range(len(drafts) + 1):
                rows.logits_rows.append(batch.sample_rows[i] + j)
                rows.params.append(req.params)
                rows.output_ids.append(req.output_ids + drafts[:j] if j else req.output_ids)
                rows.seeds.append(req.seed)
        if masks:
            rows.bitmask = allocate_bitmask(len(rows.params), vocab_size)
            for first, mask in masks:
                rows.bitmask[first : first + mask.shape[0]] = mask
        return rows


def _grammar_masks(grammar: Grammar, drafts: list[int], vocab_size: int,
                   budget: int | None) -> tuple[torch.Tensor, int]:
    """(masks [n + 1, W], n): row j is the grammar's bitmask after accepting drafts[:j], for the
    longest prefix of n drafts it accepts. `budget` (budget-aware requests): tokens the request may
    still emit at row 0, this one included. The grammar's state is unchanged afterwards."""
    mask = allocate_bitmask(len(drafts) + 1, vocab_size)
    if budget is not None:
        grammar.set_budget(budget)
    grammar.fill_bitmask(mask, 0)
    n = 0
    for tok in drafts:  # the mask says whether the grammar accepts it (a refused accept may log a warning)
        if not (int(mask[n, tok // 32]) >> (tok % 32)) & 1 or not grammar.accept_token(tok):
            break
        n += 1
        if budget is not None:
            grammar.set_budget(budget - n)
        grammar.fill_bitmask(mask, n)
    if n:
        grammar.rollback(n)
    return mask[: n + 1], n
