"""Speculator: which of a step's rows carry drafts, and how many, under a cost model of the step.

Each request that samples from a single row this step (a decode; or a prompt served from the cache
up to its last token) may propose the tokens its n-gram index predicts (`speculative/ngram.py`). A
request completing a computed prompt chunk does not: it has no acceptance of its own yet, and the
step it would hold out of is, as often as not, the next long prompt chunk (at batch 8 on copy-heavy
extraction prompts, drafting there made the first token later and the whole batch 8-10% slower than
drafting off).

Whether a draft token is worth verifying depends on how likely it is to
be accepted and on what an extra row costs: a step costs a fixed part (reading the weights once, the
step's Python and sampling) plus a part per row, and yields one token per sampling row plus every
accepted draft. Draft tokens are added best first (draft j of a request is accepted with
probability p^j, p its estimated acceptance, over the row's cost) while each adds more expected
tokens per second than the step's current rate.

How many drafts a row keeps is known only once its result is processed, which matters under the
overlap schedule, where the next batch is built before that. A drafting request either
- waits (`hold`): it is left out of the next batch, which costs it that step at batch > 1 and the
  overlap of one step when it runs alone (the worker's measured idle gap before such a step); or
- runs on optimistically: the next batch decodes it as if every draft is accepted, and that row is
  discarded (its KV freed) when one is not, costing about one token with probability 1 - p^k.
Each request then keeps the number of drafts (possibly none) that maximises the step's expected
tokens per second with that cost counted: a request whose acceptance stays low stops drafting, at
any batch size; its old evidence fades while it does not draft, so it is retried now and then.

The step's cost is measured, not assumed (`StepCosts`): the worker's seconds per pure-decode step,
fitted as `fixed + per_row * rows + per_grammar_draft * constrained draft rows` over recent steps.
On a model that sits in the CPU cache a verify row costs about as much as a decode row (the fixed
part is small, so drafting must be accepted often to pay); on a model bound by memory bandwidth the
fixed part (reading the weights) dominates and drafting pays at lower acceptance. Until steps of
different row counts are seen, the fit leans on a prior (`FIXED_ROWS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixgen.runtime.scheduler.metrics import SchedulerMetrics
from radixgen.runtime.scheduler.request import Req
from radixgen.runtime.speculative.ngram import NgramIndex
from radixgen.runtime.speculative.state import SpecState

# a step's fixed cost in row-costs until measured (docs/speculative.md): on the high side, so that drafting is
# tried and the costs measured (SmolLM2 on CPU: about 1.5 at batch 1; a 1B GGUF: tens)
FIXED_ROWS = {"cpu": 16.0, "cuda": 48.0}
HOLD_COST_BATCHED = 1.0  # tokens a waiting request forgoes by sitting out the next step (batch > 1)
HOLD_COST_ALONE = 0.3  # the part of a step lost to the overlap when the only request waits (until measured)
GAP_DECAY = 0.9  # weight kept by older idle gaps at each new one
STALE_COST = 1.0  # tokens lost when an optimistic next step turns out to be stale
INITIAL_PRIOR = 0.6  # acceptance assumed before any verification
COST_DECAY = 0.99  # weight kept by older step timings at each new one
COST_RIDGE = 0.05  # pseudo-variance (rows^2) pulling the fitted slopes toward the prior's


@dataclass
class StepCosts:
    """Seconds of a pure-decode step as `fixed + per_row * rows + per_grammar * grammar_rows`
    (`grammar_rows`: draft rows of constrained requests, which also fill a grammar mask each), fitted
    by decayed least squares over the worker's measured step times, one fit per batch size (by the
    step's rows before drafts, in powers of two: a row added to one decode row costs more than one
    added to eight, whose weights' reads it shares). The slopes are ridge-pulled toward the prior's
    (`prior_fixed_rows` row-costs of fixed part, no grammar surcharge), so a fit over steps that all
    had the same rows (no drafting yet) falls back to the prior, and one over steps that no longer vary
    (no drafting for a while) to what the data last said. Without any timing (`learn` False, or a worker
    that reports none) costs are the prior's, in row-costs."""

    prior_fixed_rows: float
    learn: bool = True
    # per batch-size bucket: decayed weight and weighted sums of (rows, grammar_rows, seconds) and products
    weight: dict[int, float] = field(default_factory=dict)
    sums: dict[int, list[float]] = field(default_factory=dict)  # x, g, y, xx, gg, xg, xy, gy
    learned: dict[int, float] = field(default_factory=dict)  # per bucket: the fixed row-costs last fitted from data

    @staticmethod
    def bucket(base_rows: int) -> int:
        """Batch-size bucket of a step with `base_rows` rows before drafts: 1, 2-3, 4-7, 8-15, 16+."""
        return min(max(base_rows, 1).bit_length() - 1, 4)

    def observe(self, base_rows: int, rows: int, grammar_rows: int, seconds: float) -> None:
        """A pure-decode step of `rows` rows (`base_rows` before drafts, `grammar_rows` constrained
        drafts) took `seconds`."""
        if not self.learn or seconds <= 0:
            return
        b = self.bucket(base_rows)
        x, g, y = float(rows), float(grammar_rows), seconds
        self.weight[b] = self.weight.get(b, 0.0) * COST_DECAY + 1.0
        sums = self.sums.setdefault(b, [0.0] * 8)
        for k, v in enumerate((x, g, y, x * x, g * g, x * g, x * y, g * y)):
            sums[k] = sums[k] * COST_DECAY + v

    def measured(self, base_rows: int = 1) -> bool:
        """Whether steps of this batch size have been timed (else `model` gives the prior)."""
        return self.weight.get(self.bucket(base_rows), 0.0) >= 3.0

    def model(self, base_rows: int = 1) -> tuple[float, float, float]:
        """(fixed, per_row, per_grammar_row) in seconds for a step of `base_rows` rows before drafts,
        or in row-costs before any timing."""
        b = self.bucket(base_rows)
        if not self.measured(base_rows):
            return self.prior_fixed_rows, 1.0, 0.0
        w = self.weight[b]
        mx, mg, my, xx, gg, xg, xy, gy = (v / w for v in self.sums[b])
        vxx, vgg, vxg = xx - mx * mx, gg - mg * mg, xg - mx * mg
        cxy, cgy = xy - mx * my, gy - mg * my
        prior_rows = self._prior_rows(b)
        prior_b = my / (prior_rows + mx)  # the prior's per-row seconds at this mean step time
        a11, a22, a12 = vxx + COST_RIDGE, vgg + COST_RIDGE, vxg
        r1, r2 = cxy + COST_RIDGE * prior_b, cgy
        det = a11 * a22 - a12 * a12
        per_row = max((r1 * a22 - r2 * a12) / det, my * 1e-3)  # rows never free (noise can make it <= 0)
        per_grammar = max((a11 * r2 - a12 * r1) / det, 0.0)
        fixed = max(my - per_row * mx - per_grammar * mg, 0.0)
        if vxx > COST_RIDGE:  # the rows varied enough to say: what the slopes fall back to once they no longer do
            self.learned[b] = fixed / per_row
        return fixed, per_row, per_grammar

    def _prior_rows(self, b: int) -> float:
        """What bucket b's slopes lean on: its own last fit from data, else the nearest bucket's (the
        smaller batch size on a tie), else the prior."""
        if self.learned:
            return self.learned[min(self.learned, key=lambda k: (abs(k - b), k))]
        return self.prior_fixed_rows

    def fixed_rows(self, base_rows: int = 1) -> float:
        """The fixed part of a step in row-costs (a decode row costs 1)."""
        fixed, per_row, _ = self.model(base_rows)
        return fixed / per_row


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
        # step times are measured where the worker's busy time is the step's (CPU: it runs the forward);
        # on CUDA it is launch time only, and the prior stands
        self.costs = StepCosts(FIXED_ROWS.get(device_type, FIXED_ROWS["cpu"]), learn=device_type == "cpu")
        self.overlap = overlap
        self.gap: float | None = None  # decayed mean of the worker's idle gaps before a held request's step (s)
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
        sampling = [_samples(req, n) for req, n in zip(reqs, lens, strict=True)]
        samplers = sum(sampling)
        # drafts are weighed against a pure-decode step of the sampling rows, whatever else the step
        # computes: a prompt chunk (or jump-forward text) in it is work owed anyway, not a cost that
        # makes the step's own rate low and any draft look cheap beside it
        fixed, per_row, per_grammar = self.costs.model(samplers)
        row_cost = [per_row] * len(reqs)  # seconds (or row-costs) one draft row of the request adds
        candidates: list[tuple[float, int, int]] = []  # (accepted tokens per cost, row, depth)
        for i, req in enumerate(reqs):
            if not sampling[i] or lens[i] != 1:  # drafts follow decode rows only (module docstring)
                continue
            self.attach(req)
            limit = self._limit(req)
            if req.spec is None or limit <= 0 or req.flight.pending > 1:
                continue
            req.spec.index.sync(req.fill_ids)
            conts[i], req.spec.match = req.spec.index.lookup(limit, skip=req.flight.pending)
            if not conts[i]:
                continue
            probs[i] = p = req.spec.accept_prob(self.prior(req.spec.match))
            if req.grammar is not None:
                row_cost[i] += per_grammar
            candidates += [(p ** (depth + 1) / row_cost[i], i, depth) for depth in range(len(conts[i]))]
        tokens, cost = float(samplers), fixed + per_row * samplers
        taken = [0] * len(reqs)
        for value, i, depth in sorted(candidates, key=lambda c: (-c[0], c[2])):
            if room <= 0 or value * cost <= tokens:
                break
            if depth == taken[i]:
                taken[i] += 1
                tokens, cost, room = tokens + value * row_cost[i], cost + row_cost[i], room - 1
        hold_cost = 0.0 if not self.overlap else HOLD_COST_BATCHED if len(reqs) > 1 else self.hold_cost_alone()
        for i, req in enumerate(reqs):
            if not taken[i]:
                if conts[i]:
                    req.spec.pass_up()
                continue
            gain = sum(probs[i] ** (j + 1) for j in range(taken[i]))
            k, hold = self._best_length(probs[i], taken[i], hold_cost, tokens - gain,
                                        cost - taken[i] * row_cost[i], row_cost[i])
            if k:
                out.drafts[i], out.hold[i] = conts[i][:k], hold
            else:
                req.spec.pass_up()
        return out

    @staticmethod
    def _best_length(p: float, most: int, hold_cost: float, base_tokens: float, base_cost: float,
                     row_cost: float) -> tuple[int, bool]:
        """(drafts, hold) maximising the step's expected tokens per cost, where the step yields
        `base_tokens` for `base_cost` without this request's drafts and each draft adds `row_cost`,
        its chance of acceptance, and the cost of not knowing how many are accepted before the next
        step (0 drafts when none pays)."""
        best, best_k, best_hold, gain, q = base_tokens / base_cost, 0, False, 0.0, 1.0
        for k in range(1, most + 1):
            q *= p
            gain += q
            stale = STALE_COST * (1 - q)
            rate = (base_tokens + gain - min(hold_cost, stale)) / (base_cost + k * row_cost)
            if rate > best:
                best, best_k, best_hold = rate, k, hold_cost <= stale
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

    def on_gap(self, seconds: float) -> None:
        """The worker sat idle `seconds` between a result and the next batch, whose requests waited for
        that result (what holding costs when nothing else runs)."""
        self.gap = seconds if self.gap is None else GAP_DECAY * self.gap + (1 - GAP_DECAY) * seconds

    def hold_cost_alone(self) -> float:
        """Tokens a lone request forgoes by holding: the measured idle gap over a one-row step's time."""
        fixed, per_row, _ = self.costs.model(1)
        if self.gap is None or not self.costs.measured(1):
            return HOLD_COST_ALONE
        return min(self.gap / (fixed + per_row), 1.0)

    def on_step(self, base_rows: int, batch_rows: int, grammar_draft_rows: int, seconds: float) -> None:
        """The worker's time for a landed pure-decode step (`batch_rows` rows, `base_rows` of them not
        drafts, `grammar_draft_rows` drafts of constrained requests): evidence for the cost model."""
        self.costs.observe(base_rows, batch_rows, grammar_draft_rows, seconds)


def _samples(req: Req, n: int) -> bool:
    """Whether computing the request's next `n` tokens completes its sequence, so the row samples."""
    return req.kv.kv_len + n == req.known_len and req.params.max_new_tokens > 0 and req.wants_more
