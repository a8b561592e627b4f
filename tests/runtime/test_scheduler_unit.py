"""The scheduler against a fake worker (no model): KV integrity under random workloads.

The fake worker stands in for the model: the token it samples at position p of a request is a pure
function of (the request's seed, p), so every request's expected output is known in advance (a naive
reference: generate token by token until eos or max_new_tokens). It also checks each batch's inputs
against that sequence, resolving the overlap schedule's placeholders from its own previous batch,
as the real worker does. A hypothesis state machine drives arrivals (sharing prefixes), aborts,
scheduler steps and cache flushes on a small KV pool (so it runs out: eviction, retraction, the
in-batch prefix check), and after every step checks that no KV slot is leaked or double-owned,
tree locks balance and every row agrees with the tree (`KVManager.check`).
"""

from __future__ import annotations

import functools
from concurrent.futures import Future

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixgen.radix_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.scheduler.batch import ScheduledBatch, StepOutput
from radixgen.runtime.scheduler.kv_manager import KVIntegrityError, KVManager
from radixgen.runtime.scheduler.request import Req
from radixgen.runtime.scheduler.scheduler import Scheduler
from radixgen.runtime.tokenizer import IncrementalDetokenizer, load_tokenizer
from radixgen.sampling.params import SamplingParams

EOS = 2
CONTEXT = 96


def fake_token(seed: int, pos: int) -> int:
    """The token the fake model samples at sequence position `pos` (eos now and then)."""
    if (seed * 5 + pos * 3) % 23 == 0:
        return EOS
    return 300 + (seed * 7919 + pos * 104729) % 3000


def seeded_token(req: Req, pos: int) -> int:
    return fake_token(req.seed, pos)


def expected_output(req: Req, token_fn=seeded_token) -> list[int]:
    """The reference: token by token until eos, max_new_tokens or the context length."""
    out: list[int] = []
    n = len(req.input_ids)
    while len(out) < req.params.max_new_tokens:
        tok = token_fn(req, n + len(out))
        out.append(tok)
        if (tok == EOS and not req.params.ignore_eos) or n + len(out) >= CONTEXT:
            break
    return out


class FakeWorker:
    """Answers batches at once with `token_fn(req, position)` (default: `fake_token` of the request's
    seed); asserts the batch's inputs are the right tokens. A request verifying drafts has its
    drafts as inputs after its chunk, and "samples" the true token after each draft prefix, as a
    model would."""

    busy_seconds = 0.0

    def __init__(self, token_fn=seeded_token, fast_decode_rows: int | None = None) -> None:
        self.token_fn = token_fn
        self.fast_decode_rows = fast_decode_rows
        self.last_sampled: list[int] = []
        self.batches = 0
        self.drafts_seen = 0

    def submit(self, batch: ScheduledBatch) -> Future[StepOutput]:
        fb = batch.forward
        ids, pos = fb.input_ids.tolist(), fb.positions.tolist()
        offset = 0
        sampled: list[list[int]] = []
        last: list[int] = []
        for i, req in enumerate(batch.reqs):
            start, n, drafts = batch.starts[i], batch.extend_lens[i], batch.drafts[i]
            chunk = n - len(drafts)
            for j in range(n):
                tok = ids[offset + j]
                if tok < 0:  # placeholder: the previous batch's sampled token
                    tok = self.last_sampled[-tok - 1]
                p = pos[offset + j]
                assert p == start + j
                if j < chunk:
                    want = req.input_ids[p] if p < len(req.input_ids) else self.token_fn(req, p)
                    assert tok == want, f"{req.rid}: input at position {p} is {tok}, expected {want}"
                else:
                    assert tok == drafts[j - chunk], f"{req.rid}: draft input at {p} is {tok}"
            offset += n
            self.drafts_seen += len(drafts)
            if batch.samples[i]:
                sampled.append([self.token_fn(req, start + chunk + j) for j in range(len(drafts) + 1)])
                last.append(sampled[-1][-1])
            else:
                sampled.append([])
        self.last_sampled = last
        self.batches += 1
        k = len(batch.reqs)
        fut: Future[StepOutput] = Future()
        fut.set_result(StepOutput(sampled, [[None] * len(t) for t in sampled], [[[]] * len(t) for t in sampled],
                                  [[] for _ in range(k)], [[] for _ in range(k)]))
        return fut

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer():
    return shared_tokenizer()


@functools.cache
def shared_tokenizer():
    return load_tokenizer()


def make_scheduler(pool: int, running: int, chunk: int, page_size: int = 1, overlap: bool = True,
                   radix: bool = True, worker: FakeWorker | None = None, **config) -> Scheduler:
    config = EngineConfig(max_total_tokens=max(pool, 16), max_running_requests=running, chunked_prefill_size=chunk,
                          page_size=page_size, disable_overlap=not overlap, disable_radix_cache=not radix, **config)
    kv = KVManager(ReqToTokenPool(running, CONTEXT + 1), TokenToKVPool(pool, 1, 1, 1, torch.float32), page_size,
                   not radix)
    return Scheduler(config, worker or FakeWorker(), kv, CONTEXT, {EOS}, start=False)


def make_req(tokenizer, rid: str, ids: list[int], max_new: int, seed: int,
             ignore_eos: bool = False) -> tuple[Req, list[dict]]:
    chunks: list[dict] = []
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos)
    req = Req(rid=rid, input_ids=ids, params=params, seed=seed, emit=chunks.append,
              detok=IncrementalDetokenizer(tokenizer, ids, []))
    return req, chunks


def run_until_idle(s: Scheduler, limit: int = 2000) -> None:
    for _ in range(limit):
        if not s.busy and s.inbox.empty():
            return
        s.step()
        s.kv.check(s.running + s.waiting)
    raise AssertionError("the scheduler did not become idle")


PREFIXES = [[400 + i for i in range(n)] for n in (0, 9, 24)]


class SchedulerMachine(RuleBasedStateMachine):
    """Random arrivals, aborts, steps and flushes; KV checked after every step."""

    @initialize(pool=st.integers(24, 160), running=st.integers(1, 6), chunk=st.integers(3, 40),
                page=st.sampled_from([1, 1, 4]), overlap=st.booleans(), radix=st.sampled_from([True, True, False]))
    def setup(self, pool: int, running: int, chunk: int, page: int, overlap: bool, radix: bool) -> None:
        self.tok = shared_tokenizer()
        self.token_fn = seeded_token
        self.s = make_scheduler(pool, running, chunk, page, overlap, radix)
        self.reqs: list[tuple[Req, list[dict]]] = []

    @rule(prefix=st.sampled_from(range(len(PREFIXES))), suffix=st.lists(st.integers(3000, 3100), min_size=1,
                                                                         max_size=20),
          max_new=st.integers(0, 30), seed=st.integers(0, 10**6), ignore_eos=st.booleans())
    def arrive(self, prefix: int, suffix: list[int], max_new: int, seed: int, ignore_eos: bool) -> None:
        ids = PREFIXES[prefix] + suffix
        if len(ids) >= CONTEXT or len(ids) + 1 > self.s.kv.capacity:
            return  # the engine rejects these before they reach the scheduler
        req, chunks = make_req(self.tok, f"r{len(self.reqs)}", ids, min(max_new, CONTEXT - len(ids)), seed, ignore_eos)
        self.s.add_request(req)
        self.reqs.append((req, chunks))

    @precondition(lambda self: any(r.finished is None for r, _ in self.reqs))
    @rule(data=st.data())
    def abort(self, data) -> None:
        live = [r for r, _ in self.reqs if r.finished is None]
        self.s.abort(data.draw(st.sampled_from(live)).rid)

    @rule(n=st.integers(1, 6))
    def step(self, n: int) -> None:
        for _ in range(n):
            self.s.step()
            self.s.kv.check(self.s.running + self.s.waiting)

    @rule()
    def flush(self) -> None:
        if not self.s.busy and self.s.inbox.empty():
            assert self.s._flush_cache()
            assert self.s.kv.used() == 0

    @invariant()
    def kv_consistent(self) -> None:
        if hasattr(self, "s"):
            self.s.kv.check(self.s.running + self.s.waiting)

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        run_until_idle(self.s)
        for req, chunks in self.reqs:
            assert req.finished is not None and len(chunks) == 1, req.rid
            want = expected_output(req, self.token_fn)
            if req.finished.type == "abort":
                assert req.output_ids == want[: len(req.output_ids)], req.rid
                continue
            assert req.output_ids == want, req.rid
            assert chunks[0]["output_ids"] == want
        kv = self.s.kv
        assert kv.tree.protected_size() == 0  # every lock released
        assert kv.used() == kv.tree.total_size()  # what is not free is the tree's
        assert kv.req_pool.available_size() == kv.req_pool.size


TestRandomWorkloadsKeepKVConsistent = SchedulerMachine.TestCase
TestRandomWorkloadsKeepKVConsistent.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                                        derandomize=True, suppress_health_check=list(HealthCheck))


def test_retraction_and_chunking_keep_outputs(tokenizer):
    """16 requests on a 120-slot pool with 8-token chunks: retractions happen, outputs are the reference's."""
    s = make_scheduler(pool=120, running=16, chunk=8)
    reqs = [make_req(tokenizer, f"r{i}", PREFIXES[i % 3] + [3000 + i] * (4 + i % 5), 30, seed=i, ignore_eos=True)
            for i in range(16)]
    for req, _ in reqs:
        s.add_request(req)
    run_until_idle(s)
    assert s.metrics.retractions > 0
    assert [r.output_ids for r, _ in reqs] == [expected_output(r) for r, _ in reqs]


def test_prefix_hits_skip_computed_tokens(tokenizer):
    s = make_scheduler(pool=400, running=8, chunk=64)
    first, _ = make_req(tokenizer, "a", PREFIXES[2] + [3001, 3002], 3, seed=1)
    s.add_request(first)
    run_until_idle(s)
    second, _ = make_req(tokenizer, "b", PREFIXES[2] + [3005], 3, seed=2)
    s.add_request(second)
    run_until_idle(s)
    assert second.cached_tokens == len(PREFIXES[2])
    assert second.output_ids == expected_output(second)


def test_check_catches_a_leaked_slot(tokenizer):
    """The integrity check is not vacuous: a slot taken behind the manager's back is reported."""
    s = make_scheduler(pool=64, running=4, chunk=16)
    req, _ = make_req(tokenizer, "a", PREFIXES[1] + [3001], 8, seed=3)
    s.add_request(req)
    run_until_idle(s)
    s.kv.check([])
    s.kv.kv_pool.alloc(1)
    with pytest.raises(KVIntegrityError, match="leaked"):
        s.kv.check([])


def test_check_catches_an_unbalanced_lock(tokenizer):
    s = make_scheduler(pool=64, running=4, chunk=16)
    req, _ = make_req(tokenizer, "a", PREFIXES[2] + [3001], 2, seed=4)
    s.add_request(req)
    run_until_idle(s)
    node = s.kv.tree.match_prefix(PREFIXES[2]).last_node
    s.kv.tree.inc_lock_ref(node)
    with pytest.raises(KVIntegrityError, match="lock"):
        s.kv.check([])


def test_request_outgrowing_the_pool_is_aborted_not_stuck(tokenizer):
    """A lone request whose sequence grows past the whole pool is retracted and could never be
    prefilled again: it finishes with "abort" instead of hanging the scheduler."""
    s = make_scheduler(pool=38, running=1, chunk=17, page_size=4, radix=False)
    req, chunks = make_req(tokenizer, "a", [3000 + i for i in range(33)], 22, seed=5, ignore_eos=True)
    s.add_request(req)
    run_until_idle(s)
    assert req.finished.type == "abort" and "outgrew the KV pool" in req.finished.message
    assert req.output_ids == expected_output(req)[: len(req.output_ids)] and len(chunks) == 1
    assert s.kv.used() == s.kv.tree.total_size()
