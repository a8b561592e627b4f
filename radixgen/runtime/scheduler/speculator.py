"""Speculator: which of a step's rows carry drafts, and how many, under a cost model of the step.

Each request that samples this step may propose the tokens its n-gram index predicts
(`speculative/ngram.py`). Whether a draft token is worth verifying depends on how likely it is to
be accepted and on what an extra row costs: a step of `rows` rows costs about `fixed_rows + rows`
row-costs (the fixed part: reading the weights once, the step's Python and sampling) and yields one
token per sampling row plus every accepted draft. Draft tokens are added best first (draft j of a
request is accepted with probability p^j, p its estimated acceptance) while each adds more
expected tokens than the step's current tokens per row-cost.

How many drafts a row keeps is known only once its result is processed, which matters under the
overlap schedule, where the next batch is built before that. A drafting request either
- waits (`hold`): it is left out of the next batch, which costs it that step at batch > 1 and the
  overlap of one step when it runs alone; or
- runs on optimistically: the next batch decodes it as if every draft is accepted, and that row is
  discarded (its KV freed) when one is not, costing about one token with probability 1 - p^k.
Each request takes the cheaper, and drafts only if its expected accepted tokens exceed that cost:
a request whose acceptance stays low stops drafting, at any batch size; its old evidence fades
while it does not draft, so it is retried now and then.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.runtime.scheduler.metrics import SchedulerMetrics
from radixgen.runtime.scheduler.request import Req
from radixgen.runtime.speculative.ngram import NgramIndex
from radixgen.runtime.speculative.state import SpecState

FIXED_ROWS = {"cpu": 6.0, "cuda": 48.0}  # a step's fixed cost in row-costs (measured: docs/speculative.md)
HOLD_COST_BATCHED = 1.0  # tokens a waiting request forgoes by sitting out the next step (batch > 1)
HOLD_COST_ALONE = 0.3  # the part of a step lost to the overlap when the only request waits
STALE_COST = 1.0  # tokens lost when an optimistic next step turns out to be stale
INITIAL_PRIOR = 0.6  # acceptance assumed before any verification


@dataclass
class Proposal:
    """A step's drafts (per row, [] for none) and which drafting requests wait for their result."""

    drafts: list[list[int]]
    hold: list[bool]


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
        # engine-wide evidence per suffix-match length (a long match predicts a copy better than a short
        # one): where a request's estimate starts before its own verifications count
        self.by_match = {n: SpecState(NgramIndex(1, 1)) for n in range(min_match, max_match + 1)}

    def prior(self, match: int) -> float:
        """Engine-wide acceptance of recent drafts proposed from a suffix match of `match` tokens."""
        return self.by_match[match].accept_prob(INITIAL_PRIOR)

    def attach(self, req: Req) -> None:
        """Give a request that may draft its state (once, when it first runs)."""
        if req.spec is None and req.params.speculative:
            req.spec = SpecState(NgramIndex(self.min_match, self.max_match))

    def propose(self, reqs: list[Req], lens: list[int], room: int) -> Proposal:
        """Drafts for the step's rows (request i computes lens[i] tokens); `room`: KV slots free for
        draft tokens."""
        out = Proposal([[] for _ in reqs], [False] * len(reqs))
        rows = sum(lens)
        if self.max_rows is not None and all(n == 1 for n in lens):  # keep a pure-decode step on its fast path
            room = min(room, self.max_rows - rows)
        if room <= 0:
            return out
        conts: list[list[int]] = [[] for _ in reqs]
        probs = [0.0] * len(reqs)
        candidates: list[tuple[float, int, int]] = []  # (chance the draft is accepted, row, depth)
        samplers = 0
        for i, (req, n) in enumerate(zip(reqs, lens, strict=True)):
            if not _samples(req, n):
                continue
            samplers += 1
            self.attach(req)
            limit = self._limit(req)
            if req.spec is None or limit <= 0 or req.flight.pending > 1:
                continue
            req.spec.index.sync(req.fill_ids)
            conts[i], req.spec.match = req.spec.index.lookup(limit, skip=req.flight.pending)
            if not conts[i]:
                continue
            probs[i] = p = req.spec.accept_prob(self.prior(req.spec.match))
            candidates += [(p ** (depth + 1), i, depth) for depth in range(len(conts[i]))]
        tokens, cost = float(samplers), self.fixed_rows + rows
        taken = [0] * len(reqs)
        for q, i, depth in sorted(candidates, key=lambda c: (-c[0], c[2])):
            if room <= 0 or q * cost <= tokens:
                break
            if depth == taken[i]:
                taken[i] += 1
                tokens, cost, room = tokens + q, cost + 1, room - 1
        hold_cost = 0.0 if not self.overlap else HOLD_COST_BATCHED if len(reqs) > 1 else HOLD_COST_ALONE
        for i, req in enumerate(reqs):
            k, hold = self._best_length(probs[i], taken[i], hold_cost)
            if k:
                out.drafts[i], out.hold[i] = conts[i][:k], hold
            elif conts[i]:
                req.spec.pass_up()
        return out

    @staticmethod
    def _best_length(p: float, most: int, hold_cost: float) -> tuple[int, bool]:
        """(drafts, hold) maximising expected accepted drafts less the cost of not knowing how many
        are accepted before the next step (0 drafts when none pays)."""
        best, best_k, best_hold, gain, q = 0.0, 0, False, 0.0, 1.0
        for k in range(1, most + 1):
            q *= p
            gain += q
            stale = STALE_COST * (1 - q)
            net = gain - min(hold_cost, stale)
            if net > best:
                best, best_k, best_hold = net, k, hold_cost <= stale
        return best_k, best_hold

    def _limit(self, req: Req) -> int:
        """Most drafts the request may verify now: the configured number, less than the tokens it may
        still produce (the verified row samples one more) and the room left in its context."""
        return min(self.num_draft_tokens, req.params.max_new_tokens - len(req.output_ids) - req.flight.pending - 1,
                   self.context_length - req.known_len - 1)

    def on_verified(self, req: Req, proposed: int, accepted: int, tokens: int) -> None:
        """A step's result for a request that may draft: `accepted` of its `proposed` drafts held and
        its output grew by `tokens` (accepted drafts, the sampled token, jump-forward text)."""
        req.spec.record(proposed, accepted)
        m = self.metrics
        m.spec_verify_ct += 1
        m.spec_completion_tokens += tokens
        m.spec_num_proposed_drafts += proposed
        m.spec_num_correct_drafts += accepted
        if proposed:
            self.by_match[req.spec.match].record(proposed, accepted)


def _samples(req: Req, n: int) -> bool:
    """Whether computing the request's next `n` tokens completes its sequence, so the row samples."""
    return req.kv.kv_len + n == req.known_len and req.params.max_new_tokens > 0 and req.wants_more
