"""Speculative decoding on SmolLM2: outputs exactly those without it (greedy and seeded, alone and in
batches, copy-heavy and not), stops and max_new_tokens never overrun, constrained outputs valid and
drafts the grammar rejects never sampled, spec metrics reported. The engine without speculation is
the oracle; the speculative engine checks its KV bookkeeping after every step (`debug_kv_check`)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator

import jsonschema
import pytest
import torch

from radixgen.grammar.base import allowed_token_ids
from radixgen.radix_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.engine import Engine
from radixgen.runtime.executor.sampling_rows import SamplingRows
from radixgen.runtime.scheduler.batch import ScheduledBatch
from radixgen.runtime.scheduler.kv_manager import KVManager
from radixgen.runtime.scheduler.request import Req
from radixgen.runtime.scheduler.speculator import StepCosts
from radixgen.runtime.tokenizer import IncrementalDetokenizer
from radixgen.sampling.params import SamplingParams

DOC = ("The meeting was held on Tuesday in the main hall. Alice Johnson, the project lead, presented the "
       "quarterly results: revenue grew by twelve percent, and the new office in Berlin opened in March. "
       "Bob Smith asked about the hiring plan for the engineering team in the second half of the year.")


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


PROMPTS = [
    chat("Repeat this text exactly:\n" + DOC),  # copies the prompt
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\ndef fib2(n):\n",  # code
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",  # a pattern
    "Once upon a time",  # free writing: drafts are rare and mostly rejected
    chat("What is the capital of France?"),
]
GREEDY = {"temperature": 0, "max_new_tokens": 40}
SCHEMA = {"type": "object", "properties": {"quote": {"type": "string"}}, "required": ["quote"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def spec_engine():
    eng = Engine(speculative_algorithm="ngram", debug_kv_check=True)
    yield eng
    eng.shutdown()


def ids(results: list[dict]) -> list[list[int]]:
    return [r["output_ids"] for r in results]


@contextlib.contextmanager
def rows_cost_nothing(eng: Engine) -> Iterator[None]:
    """Inside, `eng`'s speculator drafts whatever its lookups find: how many drafts a step's measured
    timing affords is not what a test asserting that drafts were verified checks (the full suite on a
    loaded 2-core VM fitted step costs that afforded none)."""
    speculator = eng.scheduler.speculator
    learned, speculator.costs = speculator.costs, StepCosts(1e9, learn=False)
    try:
        yield
    finally:
        speculator.costs = learned


def test_greedy_equals_plain_alone_and_batched(engine, spec_engine):
    want = engine.generate(PROMPTS, GREEDY)  # (batched equals alone without drafts: test_engine.py)
    alone = [spec_engine.generate(p, GREEDY) for p in PROMPTS]
    spec_engine.flush_cache()
    with rows_cost_nothing(spec_engine):
        batched = spec_engine.generate(PROMPTS, GREEDY)
    assert ids(alone) == ids(want)
    assert ids(batched) == ids(want)
    copy = alone[0]["meta_info"]  # most of the copy comes from drafts, alone and beside other requests
    assert copy["spec_accept_length"] > 2.5 and copy["spec_num_correct_drafts"] <= copy["spec_num_proposed_drafts"]
    assert batched[0]["meta_info"]["spec_num_correct_drafts"] > GREEDY["max_new_tokens"] / 3
    free = alone[3]["meta_info"]  # free writing: drafting stops after a few rejections
    assert free["spec_num_proposed_drafts"] < GREEDY["max_new_tokens"] / 4
    assert spec_engine.flush_cache()  # every request released its KV (checked after every step too)


def test_results_read_apart_with_drafts(engine):
    """The worker's CUDA pipelining (results read and handed over on a second thread while the worker
    goes on), forced on CPU with drafts: greedy tokens, seeded tokens and logprobs as plain decoding."""
    eng = Engine(speculative_algorithm="ngram", debug_kv_check=True)
    eng.scheduler.worker.read_results_apart = True
    seeded = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 32, "seed": 11}
    # both engines prefill the prompts whole, in the same precision: the shared engine's cache from earlier
    # tests would split them differently (long chunks run in two activation limbs: logprobs move ~4e-3)
    assert engine.flush_cache()
    try:
        assert ids(eng.generate(PROMPTS, GREEDY)) == ids(engine.generate(PROMPTS, GREEDY))
        assert ids(eng.generate(PROMPTS[:3], seeded)) == ids(engine.generate(PROMPTS[:3], seeded))
        with rows_cost_nothing(eng):
            got = eng.generate(PROMPTS[0], GREEDY, return_logprob=True)["meta_info"]
        want = engine.generate(PROMPTS[0], GREEDY, return_logprob=True)["meta_info"]
        assert got["spec_num_correct_drafts"] > 0
        for (a, ta), (b, tb) in zip(got["output_token_logprobs"], want["output_token_logprobs"], strict=True):
            assert ta == tb and abs(a - b) < 2e-3
        assert eng.flush_cache()
    finally:
        eng.shutdown()


def test_seeded_sampling_gives_the_same_tokens(engine, spec_engine):
    """Each position samples with its own (seed, step) uniform from the target distribution, drafted or
    not, so a seeded request's tokens are those of plain decoding."""
    params = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 32, "seed": 11}
    assert ids(spec_engine.generate(PROMPTS[:3], params)) == ids(engine.generate(PROMPTS[:3], params))


def test_stop_string_and_max_new_tokens_inside_drafts(engine, spec_engine):
    for params in ({"temperature": 0, "max_new_tokens": 60, "stop": ["Berlin"]},
                   {"temperature": 0, "max_new_tokens": 60, "stop_token_ids": [engine.tokenizer.encode(" Alice")[0]]},
                   {"temperature": 0, "max_new_tokens": 7}):
        want, got = engine.generate(PROMPTS[0], params), spec_engine.generate(PROMPTS[0], params)
        assert (got["text"], got["output_ids"]) == (want["text"], want["output_ids"])
        assert got["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
    assert "Berlin" not in spec_engine.generate(PROMPTS[0], {"temperature": 0, "max_new_tokens": 60,
                                                              "stop": ["Berlin"]})["text"]


def test_logprobs_of_accepted_drafts(engine, spec_engine):
    want = engine.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 24}, return_logprob=True, top_logprobs_num=2)
    with rows_cost_nothing(spec_engine):
        got = spec_engine.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 24}, return_logprob=True,
                                   top_logprobs_num=2)
    assert got["output_ids"] == want["output_ids"] and got["meta_info"]["spec_num_correct_drafts"] > 0
    for (a, ta), (b, tb) in zip(got["meta_info"]["output_token_logprobs"], want["meta_info"]["output_token_logprobs"],
                                strict=True):
        assert ta == tb and abs(a - b) < 2e-3
    assert [[t for _, t in s] for s in got["meta_info"]["output_top_logprobs"]] == \
        [[t for _, t in s] for s in want["meta_info"]["output_top_logprobs"]]


def test_constrained_outputs_valid_and_equal(engine, spec_engine):
    extract = chat(DOC + "\nQuote the sentence about the quarterly results exactly, as JSON.")
    json_params = {"temperature": 0, "max_new_tokens": 100, "json_schema": json.dumps(SCHEMA)}
    regex = r"[A-Za-z ]+\."  # the document's next token after "Johnson" is "," which the regex forbids
    regex_params = {"temperature": 0, "max_new_tokens": 60, "regex": regex}
    copy = chat("Repeat this text exactly:\n" + DOC)
    tight = {**json_params, "max_new_tokens": 24, "budget_aware": True}  # the quote needs more: closed early
    for prompt, params in ((extract, json_params), (copy, regex_params), (extract, tight)):
        want = engine.generate(prompt, params)
        with rows_cost_nothing(spec_engine):
            got = spec_engine.generate(prompt, params)
        assert got["output_ids"] == want["output_ids"]
        assert got["meta_info"]["finish_reason"].get("forced") == want["meta_info"]["finish_reason"].get("forced")
        assert got["meta_info"]["spec_num_proposed_drafts"] > 0
        if "json_schema" in params:
            jsonschema.validate(json.loads(got["text"]), SCHEMA)
            assert params is not tight or got["meta_info"]["finish_reason"].get("forced")
        else:
            assert re.fullmatch(regex, got["text"]), got["text"]


def test_stats_report_speculation(spec_engine):
    with rows_cost_nothing(spec_engine):
        spec_engine.generate(PROMPTS[2], GREEDY)
    stats = spec_engine.get_stats()
    assert stats["spec_verify_ct"] > 0 and stats["spec_accept_length"] >= 1
    assert 0 < stats["spec_num_correct_drafts"] <= stats["spec_num_proposed_drafts"]
    assert stats["spec_accept_rate"] == stats["spec_num_correct_drafts"] / stats["spec_num_proposed_drafts"]


def test_opt_out_request_drafts_nothing(spec_engine):
    out = spec_engine.generate(PROMPTS[0], {**GREEDY, "speculative": False})
    assert "spec_verify_ct" not in out["meta_info"]


@pytest.mark.parametrize("backend_name", ["xgrammar", "outlines"])
def test_grammar_cuts_drafts_at_the_first_rejected_token(backend_name):
    """Sampling rows of a constrained request verifying drafts: the drafts stop at the first one the
    grammar rejects, each row's bitmask is the grammar's after the drafts before it (so the row before
    the rejected draft cannot sample it), and the grammar's state is unchanged afterwards."""
    from radixgen.grammar import make_backend
    from radixgen.grammar.base import ConstraintSpec
    from radixgen.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer()
    backend = make_backend(backend_name, tok, tok.vocab_size)
    grammar = backend.matcher(backend.compile(ConstraintSpec("regex", r"[a-z]+ [a-z]+\.")))
    good = tok.encode("hello world", add_special_tokens=False)
    drafts = [*good, tok.encode(",", add_special_tokens=False)[0], *tok.encode(" there", add_special_tokens=False)]
    prompt = tok.encode("Say two words:")
    req = Req(rid="g", input_ids=prompt, params=SamplingParams(temperature=0, max_new_tokens=16), seed=0,
              detok=IncrementalDetokenizer(tok, prompt, []), emit=lambda _: None)
    req.grammar = grammar
    kv = KVManager(ReqToTokenPool(2, 64), TokenToKVPool(64, 1, 1, 1, torch.float32))
    kv.match(req)
    kv.admit(req)
    n = len(prompt) + len(drafts)
    loc, starts = kv.allocate([req], [n])
    batch = ScheduledBatch.build([req], [n], starts, loc, None, torch.device("cpu"), [drafts])
    rows = SamplingRows.build(batch, tok.vocab_size)
    assert rows.counts == [len(good) + 1]  # the comma and what follows are not verified
    assert rows.logits_rows == [batch.sample_rows[0] + j for j in range(len(good) + 1)]
    assert rows.output_ids == [good[:j] for j in range(len(good) + 1)]
    for j, tok_id in enumerate(good):
        assert tok_id in allowed_token_ids(rows.bitmask[j], tok.vocab_size).tolist()
    assert drafts[len(good)] not in allowed_token_ids(rows.bitmask[len(good)], tok.vocab_size).tolist()
    assert grammar.accept_tokens(good) and not grammar.accept_token(drafts[len(good)])  # state was unchanged
