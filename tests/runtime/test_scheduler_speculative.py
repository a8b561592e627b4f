"""Speculative decoding in the scheduler, against the fake worker (no model): KV integrity and exact
outputs while drafts are proposed, verified, accepted and rejected.

The fake model's token at a position is a pure function of the request, chosen so that n-gram drafts
are often right and often wrong: it copies the prompt in a loop (with a deviation now and then), or
repeats a short period of its own output, and emits eos at a few positions. A request's expected
output is generated token by token from that function (the naive reference), so any draft accepted
wrongly, any token emitted past eos or max_new_tokens, or any rejected draft whose KV stayed in the
request's row shows up as a wrong output or a failed `KVManager.check`, which runs after every step.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from radixgen.runtime.scheduler.request import Req
from radixgen.runtime.scheduler.scheduler import Scheduler
from radixgen.runtime.scheduler.speculator import FIXED_ROWS, StepCosts
from tests.runtime.test_scheduler_unit import (
    EOS,
    PREFIXES,
    FakeWorker,
    SchedulerMachine,
    expected_output,
    make_req,
    make_scheduler,
    run_until_idle,
    shared_tokenizer,
)


def copy_token(req: Req, pos: int) -> int:
    """Copies the prompt cyclically (odd seeds) or repeats a period of 3-9 tokens (even seeds); every
    11th-ish position deviates, and eos comes at a few positions."""
    seed = req.seed
    if (seed * 5 + pos * 3) % 53 == 0:
        return EOS
    if (seed + pos * 7) % 11 == 0:
        return 3500 + (seed + pos) % 200  # a deviation: drafts made from the pattern are wrong here
    if seed % 2:
        return req.input_ids[pos % len(req.input_ids)]
    return 300 + (seed * 7919 + pos % (3 + seed % 7) * 104729) % 3000


def cheap_rows(s: Scheduler) -> Scheduler:
    """The fake worker takes no time: give the speculator a step whose rows are cheap next to its fixed
    part (as on a GPU), so that requests draft often, at any batch size."""
    s.speculator.costs = StepCosts(FIXED_ROWS["cuda"], learn=False)
    return s


def spec_scheduler(pool: int, running: int, chunk: int, worker: FakeWorker, overlap: bool = True) -> Scheduler:
    return cheap_rows(make_scheduler(pool, running, chunk, overlap=overlap, worker=worker,
                                     speculative_algorithm="ngram"))


class SpeculativeMachine(SchedulerMachine):
    """The scheduler state machine with speculative decoding on and copy-friendly fake tokens."""

    @initialize(pool=st.integers(24, 160), running=st.integers(1, 6), chunk=st.integers(3, 40),
                page=st.sampled_from([1, 1, 4]), overlap=st.booleans(), radix=st.sampled_from([True, True, False]),
                drafts=st.integers(1, 6), min_match=st.integers(1, 3), fast_rows=st.sampled_from([None, 4, 12]))
    def setup(self, pool: int, running: int, chunk: int, page: int, overlap: bool, radix: bool, drafts: int,
              min_match: int, fast_rows: int | None) -> None:
        self.tok = shared_tokenizer()
        self.token_fn = copy_token
        worker = FakeWorker(copy_token, fast_rows)
        self.s = cheap_rows(make_scheduler(pool, running, chunk, page, overlap, radix, worker,
                                           speculative_algorithm="ngram", speculative_num_draft_tokens=drafts,
                                           speculative_ngram_min_match_window_size=min_match,
                                           speculative_ngram_max_match_window_size=min_match + 2))
        self.reqs: list[tuple[Req, list[dict]]] = []


TestSpeculativeWorkloadsKeepKVConsistent = SpeculativeMachine.TestCase
TestSpeculativeWorkloadsKeepKVConsistent.settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                                                             derandomize=True,
                                                             suppress_health_check=list(HealthCheck))


def run_copy_workload(overlap: bool, pool: int = 600, running: int = 8) -> tuple:
    """16 copy-heavy requests; returns (scheduler, worker, requests)."""
    tok = shared_tokenizer()
    worker = FakeWorker(copy_token, fast_decode_rows=20)
    s = spec_scheduler(pool, running, 24, worker, overlap)
    reqs = [make_req(tok, f"r{i}", PREFIXES[i % 3] + [3000 + i * 3 + j for j in range(5 + i % 4)], 40, seed=i)[0]
            for i in range(16)]
    for req in reqs:
        s.add_request(req)
    run_until_idle(s)
    return s, worker, reqs


def test_drafts_are_accepted_and_rejected_and_outputs_exact():
    for overlap in (True, False):
        s, worker, reqs = run_copy_workload(overlap)
        assert [r.output_ids for r in reqs] == [expected_output(r, copy_token) for r in reqs]
        stats = s.stats()
        # (drafts of a row whose result is discarded, its request having finished, are not counted)
        assert 0 < stats["spec_num_correct_drafts"] < stats["spec_num_proposed_drafts"] <= worker.drafts_seen
        assert stats["spec_accept_length"] > 1.2  # the workload copies: steps give more than one token
        assert worker.batches < sum(len(r.output_ids) for r in reqs)
        kv = s.kv
        assert kv.used() == kv.tree.total_size() and kv.tree.protected_size() == 0


def test_retraction_with_drafts_in_a_small_pool():
    s, _, reqs = run_copy_workload(overlap=True, pool=140, running=16)
    assert s.metrics.retractions > 0 and s.metrics.spec_num_correct_drafts > 0
    assert [r.output_ids for r in reqs] == [expected_output(r, copy_token) for r in reqs]


def test_max_new_tokens_and_eos_inside_accepted_drafts_end_the_output():
    """A request whose drafts run past max_new_tokens or past an eos emits exactly up to it."""
    tok = shared_tokenizer()
    s = spec_scheduler(400, 4, 64, FakeWorker(copy_token, 20))
    long_prompt = [3000 + j for j in range(12)]
    reqs = [make_req(tok, f"n{m}", long_prompt, m, seed=1, ignore_eos=True)[0] for m in (1, 2, 3, 7, 13)]
    eos_req = next(r for r in (make_req(tok, f"e{sd}", long_prompt, 40, seed=sd)[0] for sd in range(1, 200, 2))
                   if EOS in expected_output(r, copy_token)[2:])  # eos lands after some copying
    for req in [*reqs, eos_req]:
        s.add_request(req)
    run_until_idle(s)
    for req in reqs:
        assert req.output_ids == expected_output(req, copy_token)
        assert len(req.output_ids) == req.params.max_new_tokens
    assert eos_req.output_ids == expected_output(eos_req, copy_token) and eos_req.output_ids[-1] == EOS
    assert s.metrics.spec_num_correct_drafts > 0


def test_opted_out_request_never_drafts():
    tok = shared_tokenizer()
    worker = FakeWorker(copy_token, 20)
    s = spec_scheduler(400, 4, 64, worker)
    req, _ = make_req(tok, "a", [3000 + j for j in range(10)], 30, seed=3)
    req.params.speculative = False
    s.add_request(req)
    run_until_idle(s)
    assert worker.drafts_seen == 0 and req.spec is None
    assert req.output_ids == expected_output(req, copy_token)


class TimedWorker(FakeWorker):
    """A fake worker whose steps "take" `fixed + per_row * rows` seconds of busy time (as the real
    worker reports them), for the speculator's measured cost model."""

    def __init__(self, fixed: float, per_row: float) -> None:
        super().__init__(copy_token, fast_decode_rows=20)
        self.fixed, self.per_row = fixed, per_row
        self.busy_seconds = 0.0

    def submit(self, batch):
        self.busy_seconds += self.fixed + self.per_row * sum(batch.extend_lens)
        return super().submit(batch)


def test_step_costs_fit_and_fall_back_to_the_prior():
    costs = StepCosts(6.0)
    assert costs.model() == (6.0, 1.0, 0.0)  # before any timing: the prior, in row-costs
    for _ in range(50):
        costs.observe(1, 1, 0, 0.010)
    assert abs(costs.fixed_rows() - 6.0) < 0.5  # one row count only: the prior's split of the step
    for step in range(300):
        rows, grammar = 1 + step % 9, (step % 9) * (step % 2)
        costs.observe(1, rows, grammar, 0.004 + 0.001 * rows + 0.0005 * grammar)
        costs.observe(8, 8 + rows, grammar, 0.004 + 0.0004 * (8 + rows))  # batch 8: rows share the weights' reads
    fixed, per_row, per_grammar = costs.model(1)
    assert abs(fixed - 0.004) < 4e-4 and abs(per_row - 0.001) < 1e-4 and abs(per_grammar - 0.0005) < 1e-4
    fixed, per_row, _ = costs.model(8)
    assert abs(fixed - 0.004) < 4e-4 and abs(per_row - 0.0004) < 4e-5
    assert costs.model(2) == (6.0, 1.0, 0.0)  # no step of 2-3 rows timed yet


def test_drafting_follows_the_measured_cost_of_a_row():
    """Where a row costs as much as a step's fixed part (a model in cache), copy-heavy requests whose
    drafts are often wrong draft far less than where the fixed part dominates (bandwidth-bound); outputs
    are exact either way, and the fit finds the worker's costs."""
    drafts = {}
    for name, fixed in (("cache", 0.001), ("bandwidth", 0.050)):
        tok = shared_tokenizer()
        worker = TimedWorker(fixed, 0.001)
        s = make_scheduler(600, 8, 24, worker=worker, speculative_algorithm="ngram")
        reqs = [make_req(tok, f"r{i}", PREFIXES[i % 3] + [3000 + i * 3 + j for j in range(5 + i % 4)], 40,
                         seed=i)[0] for i in range(16)]
        for req in reqs:
            s.add_request(req)
        run_until_idle(s)
        assert [r.output_ids for r in reqs] == [expected_output(r, copy_token) for r in reqs]
        drafts[name] = worker.drafts_seen
        assert abs(s.speculator.costs.fixed_rows(4) - fixed / 0.001) < 0.2 * fixed / 0.001 + 0.5
    assert drafts["cache"] < drafts["bandwidth"] / 2, drafts


class MixedStepWorker(TimedWorker):
    """A TimedWorker that counts the drafts verified in steps that also compute a prompt chunk."""

    def __init__(self, fixed: float, per_row: float) -> None:
        super().__init__(fixed, per_row)
        self.mixed_steps = self.mixed_drafts = 0

    def submit(self, batch):
        if batch.prefill_tokens:
            self.mixed_steps += 1
            self.mixed_drafts += sum(len(d) for d in batch.drafts)
        return super().submit(batch)


def test_a_prompt_chunk_in_the_step_does_not_make_drafts_look_cheap():
    """Drafts in a step that also prefills are weighed as in a pure-decode step of the same sampling
    rows: where a row costs the whole step (no fixed part, as at batch 8 on a model in cache), copy-heavy
    requests decoding beside other requests' prompt chunks do not draft there either (a 2048-token chunk
    with drafts once fell into the batch-size bucket of its rows, never timed, whose prior of 16 fixed
    row-costs made every draft look cheap)."""
    tok = shared_tokenizer()
    worker = MixedStepWorker(0.0, 0.001)
    s = make_scheduler(2000, 8, 24, worker=worker, speculative_algorithm="ngram")
    for _ in range(60):  # the cost model has timed pure-decode steps of every batch size: rows only
        for rows in (1, 2, 4, 8, 16):
            for extra in (0, 3):
                s.speculator.costs.observe(rows, rows + extra, 0, 0.001 * (rows + extra))
    reqs = [make_req(tok, f"r{i}", PREFIXES[i % 3] + [3000 + i * 3 + j for j in range(20 + 3 * (i % 6))], 30,
                     seed=2 * i + 1)[0] for i in range(12)]  # odd seeds: outputs copy the prompt
    for req in reqs:
        s.add_request(req)
    run_until_idle(s)
    assert [r.output_ids for r in reqs] == [expected_output(r, copy_token) for r in reqs]
    assert worker.mixed_steps > 5 and worker.mixed_drafts == 0, (worker.mixed_steps, worker.mixed_drafts)


def test_drafts_follow_decode_rows_not_a_completing_prompt():
    """A prompt whose end predicts its continuation (a suffix match) drafts nothing in the step that
    completes it, even where rows are cheap, and then drafts as it decodes; a request sharing its prefix,
    added while that prefill is in flight, waits for it and takes the prefix from the tree."""
    tok = shared_tokenizer()
    worker = FakeWorker(copy_token, 20)
    s = spec_scheduler(600, 4, 256, worker)
    shared = [500 + j % 5 for j in range(64)]  # repeats: the prompt's end has a suffix match to draft from
    first, _ = make_req(tok, "a", shared, 12, seed=1)
    s.add_request(first)
    s.step()  # its whole prefill, in flight
    assert worker.drafts_seen == 0 and not first.flight.held
    second, _ = make_req(tok, "b", shared + [3001, 3002], 12, seed=2)
    s.add_request(second)
    run_until_idle(s)
    assert worker.drafts_seen > 0
    assert second.cached_tokens >= len(shared)
    for req in (first, second):
        assert req.output_ids == expected_output(req, copy_token)
