"""The observer in process, on a real Engine over a tiny random-weight llama (SmolLM2 tokenizer).

Oracles: each request's own meta_info (token counts, SGLang's timings), wall-clock bounds around the
stats snapshots for the windowed rates, and prometheus_client's own `observe()` for the bulk
histogram add. The server-level checks (a scraped /metrics, the JSON log of `radixgen serve`, OTLP)
are in tests/e2e/test_observability_server.py.
"""

from __future__ import annotations

import io
import json
import logging
import random
import re
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from radixgen.runtime.engine import Engine
from radixgen.runtime.observability.batch_log import BatchStatsLogger
from radixgen.runtime.observability.log_format import JsonFormatter
from radixgen.runtime.observability.metrics import add_bucket_counts
from radixgen.runtime.observability.records import RequestRecord
from radixgen.runtime.observability.request_log import TRUNCATE_AT, RequestLogger
from radixgen.runtime.scheduler.metrics import ITL_BUCKETS
from radixgen.runtime.scheduler.metrics import Histogram as BucketCounts
from radixgen.sampling.params import SamplingParams

GREEDY = {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}
STEM = "The quick brown fox jumps over the lazy dog and keeps on running through the field, "


@pytest.fixture(scope="module")
def engine(tiny_models):
    eng = Engine(model=str(tiny_models["llama"]), context_length=512, max_total_tokens=4096, stats_log_interval=0)
    yield eng
    eng.shutdown()


def gauge(engine: Engine, name: str) -> float:
    metrics = engine.observer.metrics
    return metrics.registry.get_sample_value(name, metrics.scheduler_labels)


def test_request_log_line_carries_the_request_counts(engine, caplog):
    caplog.set_level(logging.INFO, logger="radixgen.requests")
    outs = engine.generate([STEM + "one", STEM + "two", "hi"], GREEDY)
    engine.observer.refresh()  # every request finished so far is recorded when this returns
    lines = {}
    for r in caplog.records:
        if r.name == "radixgen.requests":
            fields = dict(re.findall(r"(\w+)=(\S+)", r.getMessage()))
            lines[fields["rid"]] = fields
    assert len(lines) == 3
    for out in outs:
        m, line = out["meta_info"], lines[out["meta_info"]["id"]]
        assert (int(line["prompt_tokens"]), int(line["cached_tokens"]), int(line["completion_tokens"])) == (
            m["prompt_tokens"], m["cached_tokens"], m["completion_tokens"])
        assert line["ttft"] == f"{m['first_token_latency']:.3f}s" and line["e2e"] == f"{m['e2e_latency']:.3f}s"
        assert line["finish_reason"] == "length" and line["constraint"] == "none" and line["stream"] == "false"


def test_timings_and_cached_tokens_under_kv_pressure(tiny_models):
    """A pool too small for all requests at once: waiting requests are matched against the tree again
    and again before they fit. The cached-token count must still be each request's once (counting at
    every match gave 311 here instead of 106)."""
    eng = Engine(model=str(tiny_models["llama"]), context_length=512, max_total_tokens=256, stats_log_interval=0)
    try:
        eng.generate(STEM, {**GREEDY, "max_new_tokens": 1})  # the shared stem is cached from now on
        before = eng.get_stats()
        prompts = [STEM + f"request {i} asks about " + "many different things " * 15 for i in range(6)]
        outs = eng.generate(prompts, {**GREEDY, "max_new_tokens": 30})
        after = eng.get_stats()
    finally:
        eng.shutdown()
    metas = [o["meta_info"] for o in outs]
    assert max(m["queue_time"] for m in metas) > 0.25 * max(m["e2e_latency"] for m in metas)  # some waited for KV
    assert after["cached_prompt_tokens"] - before["cached_prompt_tokens"] == sum(m["cached_tokens"] for m in metas)
    assert any(m["cached_tokens"] >= 15 for m in metas)  # the stem (later ones may find it evicted)
    for m in metas:
        assert 0 <= m["queue_time"] <= m["first_token_latency"] <= m["e2e_latency"]


def test_windowed_gauges_between_refreshes(engine):
    t0 = time.perf_counter()
    engine.observer.refresh()
    t1 = time.perf_counter()
    outs = engine.generate([STEM + "three", STEM + "four"], GREEDY)
    t2 = time.perf_counter()
    engine.observer.refresh()
    t3 = time.perf_counter()
    metas = [o["meta_info"] for o in outs]
    generated = sum(m["completion_tokens"] for m in metas)
    # the window runs between the two snapshots, which were taken inside the two refresh calls
    assert generated / (t3 - t0) <= gauge(engine, "sglang:gen_throughput") <= generated / (t2 - t1)
    cached, prompt = sum(m["cached_tokens"] for m in metas), sum(m["prompt_tokens"] for m in metas)
    assert cached > 0 and gauge(engine, "sglang:cache_hit_rate") == pytest.approx(cached / prompt)
    engine.generate("x", {**GREEDY, "max_new_tokens": 1, "ignore_eos": False})  # no cache hit this window
    engine.observer.refresh()
    assert gauge(engine, "sglang:cache_hit_rate") == 0


def test_batch_lines_sum_the_interval(engine, caplog):
    log = BatchStatsLogger()
    log.lines(engine.get_stats())  # start of the interval
    t0 = time.perf_counter()
    outs = engine.generate([STEM + "five", STEM + "six", "a different prompt"], GREEDY)
    t1 = time.perf_counter()
    time.sleep(0.05)  # a finished request's KV is released a step after its answer
    lines = dict((f["kind"], (msg, f)) for msg, f in log.lines(engine.get_stats()))
    metas = [o["meta_info"] for o in outs]
    msg, prefill = lines["prefill"]
    assert prefill["new_seqs"] == 3 and prefill["cached_tokens"] == sum(m["cached_tokens"] for m in metas)
    assert prefill["new_tokens"] == sum(m["prompt_tokens"] - m["cached_tokens"] for m in metas)
    assert msg.startswith(f"Prefill batch, #new-seq: 3, #new-token: {prefill['new_tokens']}, ")
    msg, decode = lines["decode"]
    assert decode["running"] == 0 and decode["tokens"] == 0 and decode["token_usage"] == 0
    assert decode["gen_throughput"] <= sum(m["completion_tokens"] for m in metas) / (t1 - t0) * 1.001
    assert msg.startswith("Decode batch, #running-req: 0, #token: 0, token usage: 0.00, gen throughput (token/s): ")
    assert log.lines(engine.get_stats()) == []  # an idle interval prints nothing


def test_bulk_histogram_add_equals_observe():
    rng = random.Random(3)
    values = [rng.expovariate(40) for _ in range(500)] + list(ITL_BUCKETS) + [0.0, 1e6]  # bounds: le is inclusive
    counts = BucketCounts(ITL_BUCKETS)
    bulk_reg, each_reg = CollectorRegistry(), CollectorRegistry()
    bulk = Histogram("itl_seconds", "x", registry=bulk_reg, buckets=ITL_BUCKETS)
    each = Histogram("itl_seconds", "x", registry=each_reg, buckets=ITL_BUCKETS)
    for v in values:
        counts.observe(v)
        each.observe(v)
    add_bucket_counts(bulk, counts.minus(BucketCounts(ITL_BUCKETS)))

    def samples(reg: CollectorRegistry) -> dict:
        return {s.name + str(sorted(s.labels.items())): s.value for m in reg.collect() for s in m.samples
                if not s.name.endswith("_created")}

    got, want = samples(bulk_reg), samples(each_reg)
    assert got.keys() == want.keys() and got.pop("itl_seconds_sum[]") == pytest.approx(want.pop("itl_seconds_sum[]"))
    assert got == want and want["itl_seconds_count[]"] == len(values)
    assert generate_latest(bulk_reg).count(b"_bucket") == len(ITL_BUCKETS) + 1


def test_request_bodies_by_level_and_the_json_format(engine):
    prompt = "word " * 450  # > 2048 characters, < the 512-token context
    out = engine.generate(prompt, {**GREEDY, "max_new_tokens": 3})
    params = SamplingParams.from_dict({**GREEDY, "max_new_tokens": 3, "top_k": 7})
    rec = RequestRecord.from_meta(out["meta_info"], params=params, input_ids=engine.tokenizer.encode(prompt),
                                  stream=False, grammar_wait=None, finished_at=time.time(), output_text=out["text"])
    level0 = RequestLogger(engine.tokenizer, log_requests=False, level=3).fields(rec)
    level1 = RequestLogger(engine.tokenizer, log_requests=True, level=1).fields(rec)
    level2 = RequestLogger(engine.tokenizer, log_requests=True, level=2).fields(rec)
    level3 = RequestLogger(engine.tokenizer, log_requests=True, level=3).fields(rec)
    assert "sampling_params" not in level0 and "prompt" not in level1
    assert level1["sampling_params"] == {"max_new_tokens": 3, "temperature": 0, "top_k": 7, "ignore_eos": True}
    assert level3["prompt"] == prompt and level3["output"] == out["text"]
    assert level2["prompt"] == prompt[:TRUNCATE_AT] + f"...({len(prompt) - TRUNCATE_AT} more characters)"
    engine.observer.refresh()  # the engine's own line for this request is logged before the handler goes on
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("radixgen.requests")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        RequestLogger(engine.tokenizer, log_requests=True, level=3).log(rec)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    line = json.loads(stream.getvalue())
    assert line["logger"] == "radixgen.requests" and line["level"] == "INFO"
    assert line["message"].startswith(f"Finish: rid={rec.rid} prompt_tokens={rec.prompt_tokens} ")
    assert "prompt=" not in line["message"] and line["request"]["prompt"] == prompt  # bodies only as fields
    assert line["request"]["completion_tokens"] == out["meta_info"]["completion_tokens"] == 3


def test_speculative_series_sum_the_requests_counts(tiny_models):
    """With n-gram drafting on, the spec counters equal the sums of the requests' own meta_info
    counts, and the gauges the engine's since-start ratios."""
    eng = Engine(model=str(tiny_models["llama"]), context_length=512, max_total_tokens=4096, stats_log_interval=0,
                 speculative_algorithm="ngram")
    try:
        loop = "one two three four five six seven eight " * 6
        metas = [o["meta_info"] for o in eng.generate([loop, loop + "one"], {**GREEDY, "max_new_tokens": 24})]
        eng.observer.refresh()
        stats = eng.get_stats()
        m = eng.observer.metrics
        count = lambda name: m.registry.get_sample_value(name, m.scheduler_labels)  # noqa: E731
        proposed = sum(x["spec_num_proposed_drafts"] for x in metas)
        assert proposed > 0 and count("radixgen:spec_proposed_drafts_total") == proposed
        assert count("radixgen:spec_correct_drafts_total") == sum(x["spec_num_correct_drafts"] for x in metas)
        assert count("radixgen:spec_verify_steps_total") == stats["spec_verify_ct"] > 0
        assert gauge(eng, "sglang:spec_accept_length") == pytest.approx(stats["spec_accept_length"])
        assert gauge(eng, "sglang:spec_accept_rate") == pytest.approx(stats["spec_accept_rate"])
    finally:
        eng.shutdown()
