"""Observability of the real `radixgen serve` (a tiny random-weight llama, SmolLM2 tokenizer), end to end.

One server runs with JSON logs, request bodies logged, batch lines every 0.5 s and OTLP traces sent
to a collector stand-in on 127.0.0.1. A handful of requests (OpenAI chat, streamed chat, completions,
native /generate with a regex constraint and with a W3C traceparent) are the oracle: the usage and
meta_info the API returned to the client. Against it:

- /metrics, parsed by prometheus_client's own parser: every SGLang name the issue lists is there;
  request counters, token counters and histogram counts equal what was sent and returned; token usage
  and running requests are back to 0 once idle;
- every metric the Grafana dashboard in docs/ queries exists on /metrics, with the labels it uses;
- the request log has one JSON line per request whose counts, texts and constraint match the response;
  "Prefill batch" / "Decode batch" lines appear;
- the collector receives each request's span tree, the traced request under the caller's trace.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

openai = pytest.importorskip("openai")
trace_pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "radixgen-dashboard.json"
ISSUE_NAMES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
               "sglang:gen_throughput", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
               "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
               "sglang:e2e_request_latency_seconds")
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


class Collector:
    """An OTLP/HTTP traces endpoint: decodes each export request and keeps its spans."""

    def __init__(self) -> None:
        self.spans: list = []
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = trace_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
                spans.extend(s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans)
                out = trace_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def collector():
    c = Collector()
    yield c
    c.httpd.shutdown()


@pytest.fixture(scope="module")
def srv(tiny_models, start_server, collector):
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # export spans every 0.1 s (inherited by the server)
    try:
        return start_server("--model", str(tiny_models["llama"]), "--served-model-name", "tiny",
                            "--context-length", "512", "--max-total-tokens", "4096", "--num-threads", "1",
                            "--log-level", "info", "--log-format", "json", "--log-requests",
                            "--log-requests-level", "3", "--stats-log-interval", "0.5",
                            "--otlp-traces-endpoint", collector.url)
    finally:
        del os.environ["OTEL_BSP_SCHEDULE_DELAY"]


@pytest.fixture(scope="module")
def traffic(srv):
    """Send the requests once; returns what the API reported for each, in order."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "Name three colors, please."}]
    sent = []
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
    sent.append(dict(usage=full.usage, stream=False))
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    sent.append(dict(usage=chunks[-1].usage, stream=True))
    comp = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=5, temperature=0)
    sent.append(dict(usage=comp.usage, stream=False))
    status, regex = srv.post("/generate", {"text": "Digits:", "rid": "obs-regex", "sampling_params": {
        "regex": "[0-9]{3}", "max_new_tokens": 8, "temperature": 0}})
    assert status == 200
    sent.append(dict(meta=regex["meta_info"], text=regex["text"], stream=False))
    status, traced = srv.post("/generate", {"text": "Once upon a time", "rid": "obs-traced", "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}},
        headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    assert status == 200
    sent.append(dict(meta=traced["meta_info"], text=traced["text"], stream=False))
    for s in sent:  # one shape: (prompt, completion, cached) tokens as the client saw them
        if "usage" in s:
            u = s["usage"]
            s["counts"] = (u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens)
        else:
            m = s["meta"]
            s["counts"] = (m["prompt_tokens"], m["completion_tokens"], m["cached_tokens"])
    return sent


def scrape(srv) -> tuple[dict[tuple[str, frozenset], float], dict[str, str]]:
    """Every sample of /metrics as {(name, labels): value}, and each family's type."""
    status, text = srv.get("/metrics")
    assert status == 200
    samples, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[s.name, frozenset(s.labels.items())] = s.value
    return samples, types


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum of a series over all label sets that include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def idle_scrape(srv) -> tuple[dict, dict]:
    """/metrics once no request is running (a finished request's KV is released a step after its answer)."""
    deadline = time.monotonic() + 20
    while True:
        samples, types = scrape(srv)
        if total(samples, "sglang:num_running_reqs") == 0 or time.monotonic() > deadline:
            return samples, types
        time.sleep(0.1)


def test_metrics_match_the_requests_sent(srv, traffic):
    samples, types = idle_scrape(srv)
    names = {n for n, _ in samples}
    for name in ISSUE_NAMES:
        assert name in names or f"{name}_count" in names, name
    assert types["sglang:time_to_first_token_seconds"] == types["sglang:inter_token_latency_seconds"] == "histogram"
    assert types["sglang:prompt_tokens"] == "counter" and types["sglang:num_running_reqs"] == "gauge"
    n = len(traffic)
    prompt, completion, cached = (sum(s["counts"][i] for s in traffic) for i in range(3))
    assert total(samples, "sglang:num_requests_total") == n
    assert total(samples, "sglang:num_requests_total", is_streaming="true") == 1
    assert total(samples, "sglang:prompt_tokens_total") == prompt
    assert total(samples, "sglang:generation_tokens_total") == completion
    assert cached > 0  # the second chat prompt was served from the radix cache
    assert total(samples, "sglang:cached_tokens_total", cache_source="device") == cached
    assert total(samples, "sglang:num_so_requests_total") == 1 and total(samples, "sglang:num_grammar_total") == 1
    assert total(samples, "sglang:grammar_compilation_time_seconds_count") == 1
    for hist in ("sglang:e2e_request_latency_seconds", "sglang:time_to_first_token_seconds",
                 "sglang:queue_time_seconds", "sglang:prompt_tokens_histogram"):
        assert total(samples, f"{hist}_count") == n, hist
        assert total(samples, f"{hist}_bucket", le="+Inf") == n, hist
    # every sampled token after a request's first has one inter-token gap (no jump-forward here)
    assert total(samples, "sglang:inter_token_latency_seconds_count") == completion - n
    assert total(samples, "sglang:realtime_tokens_total", mode="decode") == completion
    assert 0 < total(samples, "sglang:time_to_first_token_seconds_sum") < total(
        samples, "sglang:e2e_request_latency_seconds_sum")
    ttft = sorted((float(dict(ls)["le"]), v) for (nm, ls), v in samples.items()
                  if nm == "sglang:time_to_first_token_seconds_bucket" and ("is_streaming", "false") in ls)
    assert [v for _, v in ttft] == sorted(v for _, v in ttft)  # cumulative buckets
    # idle: nothing running or queued, and no KV held by requests (the radix cache keeps the rest)
    assert total(samples, "sglang:num_running_reqs") == total(samples, "sglang:num_queue_reqs") == 0
    assert total(samples, "sglang:token_usage") == total(samples, "sglang:kv_used_tokens") == 0
    assert total(samples, "sglang:kv_evictable_tokens") > 0
    assert total(samples, "sglang:max_total_num_tokens") == 4096 and total(samples, "sglang:context_len") == 512
    assert 0 <= total(samples, "sglang:cache_hit_rate") <= 1  # of the latest prefills (checked in tests/observability)
    assert total(samples, "radixgen:finished_requests_total", constraint="regex") == 1
    assert all(dict(ls)["model_name"] == "tiny" for (nm, ls), _ in samples.items() if nm.startswith("sglang:"))
    stats = json.loads(srv.get("/stats")[1])
    assert stats["running"] == 0 and stats["requests_finished"] == n and stats["itl"]["count"] == completion - n


def test_dashboard_queries_only_exported_metrics(srv, traffic):
    samples, _ = idle_scrape(srv)
    labels_of: dict[str, set[str]] = {}
    values_of: dict[tuple[str, str], set[str]] = {}
    for (name, ls), _ in samples.items():
        labels_of.setdefault(name, set()).update(k for k, _ in ls)
        for k, v in ls:
            values_of.setdefault((name, k), set()).add(v)
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    assert len(exprs) > 20
    seen = set()
    for expr in exprs:
        used = re.findall(r"((?:sglang|radixgen):[A-Za-z0-9_:]+)(\{[^}]*\})?", expr)
        assert used, expr
        for name, matchers in used:
            assert name in labels_of, f"{name} (in {expr!r}) is not on /metrics"
            seen.add(name)
            for key, op, value in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', matchers):
                assert key in labels_of[name], f"{name} has no label {key!r}"
                if op == "=" and "$" not in value:
                    assert value in values_of[name, key], f"{name} never has {key}={value!r}"
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for key in (k.strip() for k in group.split(",")):
                # dp_rank labels data-parallel replicas only (absent here, so Prometheus groups all as one)
                assert key == "dp_rank" or any(key in labels_of[n] for n, _ in used), (key, expr)
    assert len(seen) >= 25


def json_log(srv) -> list[dict]:
    return [json.loads(line) for line in srv.log.read_text().splitlines() if line.startswith("{")]


def test_request_log_lines_match_the_responses(srv, traffic):
    srv.get("/metrics")  # records every finished request first
    finishes = [r for r in json_log(srv) if r["logger"] == "radixgen.requests"]
    assert len(finishes) == len(traffic)
    assert sorted(tuple(r["request"][k] for k in ("prompt_tokens", "completion_tokens", "cached_tokens"))
                  for r in finishes) == sorted(s["counts"] for s in traffic)
    for r in finishes:
        assert r["level"] == "INFO" and r["message"].startswith(f"Finish: rid={r['request']['rid']} ")
    by_rid = {r["request"]["rid"]: r["request"] for r in finishes}
    regex, meta = by_rid["obs-regex"], traffic[3]["meta"]
    assert regex["constraint"] == "regex" and regex["finish_reason"] == meta["finish_reason"]["type"]
    assert regex["prompt"] == "Digits:" and regex["output"] == traffic[3]["text"]  # bodies at level 3
    assert regex["sampling_params"]["regex"] == "[0-9]{3}"
    assert regex["ttft"] == pytest.approx(meta["first_token_latency"], abs=1e-5)
    assert regex["e2e_latency"] == pytest.approx(meta["e2e_latency"], abs=1e-3)
    assert sorted(r["request"]["stream"] for r in finishes) == [False] * 4 + [True]
    deadline = time.monotonic() + 10  # batch lines come every 0.5 s while the engine works
    while True:
        kinds = {r["stats"]["kind"] for r in json_log(srv) if r["logger"] == "radixgen.batch"}
        if kinds == {"prefill", "decode"} or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert kinds == {"prefill", "decode"}
    batch = [r["message"] for r in json_log(srv) if r["logger"] == "radixgen.batch"]
    assert any(m.startswith("Decode batch, #running-req: ") and "gen throughput (token/s): " in m for m in batch)


def test_otlp_traces_reach_the_collector(traffic, collector):
    deadline = time.monotonic() + 20
    while True:
        roots = {a.value.string_value: s for s in list(collector.spans) if s.name == "radixgen.request"
                 for a in s.attributes if a.key == "gen_ai.response.id"}
        if len(roots) >= len(traffic) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(roots) == len(traffic)
    traced = roots["obs-traced"]
    assert traced.trace_id.hex() == TRACE_ID and traced.parent_span_id.hex() == PARENT_ID
    children = {s.name: s for s in collector.spans if s.parent_span_id == traced.span_id}
    assert set(children) == {"radixgen.queue", "radixgen.prefill", "radixgen.decode"}
    assert (traced.start_time_unix_nano <= children["radixgen.queue"].start_time_unix_nano
            <= children["radixgen.prefill"].start_time_unix_nano <= children["radixgen.decode"].start_time_unix_nano
            <= children["radixgen.decode"].end_time_unix_nano <= traced.end_time_unix_nano)
    attrs = {a.key: a.value for a in traced.attributes}
    meta = traffic[4]["meta"]
    assert attrs["gen_ai.usage.input_tokens"].int_value == meta["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"].int_value == meta["completion_tokens"] == 4
    other_traces = {s.trace_id for rid, s in roots.items() if rid != "obs-traced"}
    assert bytes.fromhex(TRACE_ID) not in other_traces  # untraced requests start their own traces
