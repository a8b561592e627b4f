"""Speculator: which of a step's rows carry drafts, and how many, under a cost model of the step.

Each request that samples this step may propose the tokens its n-gram index predicts
(`ngram.py`). Whether a draft token is worth verifying depends on how likely it is to be accepted
and on what an extra row costs: a step of `rows` rows costs about `fixed_rows + rows` row-costs
(the fixed part: reading the weights once, the step's Python and sampling) and yields one token
per sampling row plus every accepted draft. Draft tokens are added best first (draft j of a
request is accepted with probability p^j, p its estimated acceptance) while each adds more
expected tokens than the step's current tokens per row-cost. A request whose acceptance stays low
therefore stops drafting, at any batch size; its old evidence fades while it does not draft, so it
is retried now and then.

Rows verifying drafts make the request skip the next step (its inputs depend on how many drafts
are accepted; see `Scheduler`), which costs about one token at batch > 1 under the overlap
schedule and part of the overlap at batch 1: a request drafts only if its drafts are expected
to win that back.
"""

from __future__ import annotations

from radixgen.runtime.scheduler.metrics import SchedulerMetrics
from radixgen.runtime.scheduler.request import Req
from radixgen.runtime.speculative.ngram import NgramIndex
from radixgen.runtime.speculative.state import SpecState

FIXED_ROWS = {"cpu": 6.0, "cuda": 48.0}  # a step's fixed cost in row-costs (measured: docs/speculative.md)
SKIP_COST_BATCHED = 1.0  # tokens a drafting request forgoes by skipping the next step (overlap, batch > 1)
SKIP_COST_ALONE = 0.3  # the part of a step's overlap lost when the only request skips it
INITIAL_PRIOR = 0.6  # acceptance assumed before any verification


class Speculator:
    """Proposes drafts for a step's rows and learns from their verification (scheduler thread)."""

    def __init__(self, num_draft_tokens: int, min_match: int, max_match: int, context_length: int,
                 max_rows: int | None, device_type: str, overlap: bool, metrics: SchedulerMetrics) -> None:
        self.num_draft_tokens = num_draft_tokens
        self.min_match, self.max_match = min_match, max_match
        self.context_length = context_length
        self.max_rows = max_rows  # rows a pure-decode step may have and keep its fast path (None: no limit)
        self.fixed_rows = FIXED_ROWS.get(device_type, FIXED_ROWS["cpu"])
        self.overlap = overlap
        self.metrics = metrics
        self.global_state = SpecState(NgramIndex(1, 1))  # engine-wide evidence: where requests' estimates start

    @property
    def prior(self) -> float:
        """Engine-wide acceptance estimate (recent verifications of all requests)."""
        return self.global_state.accept_prob(INITIAL_PRIOR)

    def attach(self, req: Req) -> None:
        """Give a request that may draft its state (once, when it first runs)."""
        if req.spec is None and req.params.speculative:
            req.spec = SpecState(NgramIndex(self.min_match, self.max_match))

    def propose(self, reqs: list[Req], lens: list[int], room: int) -> list[list[int]]:
        """Drafts for each of the step's rows (request i computes lens[i] tokens); `room`: KV slots
        free for draft tokens. Rows that do not draft get []."""
        drafts: list[list[int]] = [[] for _ in reqs]
        rows = sum(lens)
        if self.max_rows is not None and all(n == 1 for n in lens):  # keep a pure-decode step on its fast path
            room = min(room, self.max_rows - rows)
        if room <= 0:
            return drafts
        conts: list[list[int]] = [[] for _ in reqs]
        candidates: list[tuple[float, int, int]] = []  # (acceptance probability, row, depth)
        samplers = 0
        for i, (req, n) in enumerate(zip(reqs, lens, strict=True)):
            if not _samples(req, n):
                continue
            samplers += 1
            self.attach(req)
            limit = self._limit(req)
            if limit <= 0 or req.flight.pending > 1:
                continue
            req.spec.index.sync(req.fill_ids)
            conts[i], _ = req.spec.index.lookup(limit, skip=req.flight.pending)
            p, q = req.spec.accept_prob(self.prior), 1.0
            for depth in range(len(conts[i])):
                q *= p
                candidates.append((q, i, depth))
        tokens, cost = float(samplers), self.fixed_rows + rows
        taken, gain = [0] * len(reqs), [0.0] * len(reqs)
        for q, i, depth in sorted(candidates, key=lambda c: (-c[0], c[2])):
            if room <= 0 or q * cost <= tokens:
                break
            if depth != taken[i]:
                continue
            taken[i] += 1
            gain[i] += q
            tokens += q
            cost += 1
            room -= 1
        skip_cost = 0.0 if not self.overlap else SKIP_COST_BATCHED if len(reqs) > 1 else SKIP_COST_ALONE
        for i, req in enumerate(reqs):
            if taken[i] and gain[i] > skip_cost:
                drafts[i] = conts[i][: taken[i]]
            elif conts[i]:
                req.spec.pass_up()
        return drafts

    def _limit(self, req: Req) -> int:
        """Most drafts the request may verify now: the configured number, less than the tokens it may
        still produce (the verified row samples one more) and the room left in its context."""
        known = req.known_len
        return min(self.num_draft_tokens, req.params.max_new_tokens - len(req.output_ids) - req.flight.pending - 1,
                   self.context_length - known - 1)

    def on_verified(self, req: Req, proposed: int, accepted: int, tokens: int) -> None:
        """A step's result for a request that may draft: `accepted` of its `proposed` drafts held and
        its output grew by `tokens` (accepted drafts, the sampled token, jump-forward text)."""
        req.spec.record(proposed, accepted)
        m = self.metrics
        m.spec_verify_ct += 1
        m.spec_completion_tokens += tokens
        m.spec_num_proposed_drafts += proposed
        m.spec_num_correct_drafts += accepted
        self.global_state.record(proposed, accepted)


def _samples(req: Req, n: int) -> bool:
    """Whether computing the request's next `n` tokens completes its sequence, so the row samples."""
    return req.kv.kv_len + n == req.known_len and req.params.max_new_tokens > 0 and req.wants_more
