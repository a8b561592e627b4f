"""OpenTelemetry traces of a real Engine (tiny random-weight llama), caught by the SDK's in-memory exporter.

The run happens in a fresh interpreter: a tracer provider is process-global, and set in the test
process it would trace every later test. The script first runs a request with no provider (tracing
must be off: no tracer, the SDK never imported, no span), then installs the in-memory exporter and
runs a JSON-schema request under a caller's span, a plain request, and a native /generate through the
ASGI app with a W3C traceparent header. The oracle is each request's own meta_info (token counts,
queue time, first-token latency) and the caller's span / header ids.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("opentelemetry.sdk")

TRACE_ID, PARENT_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
SCRIPT = r"""
import asyncio, json, sys
import httpx
from radixgen.runtime.engine import Engine
from radixgen.runtime.observability import tracing

eng = Engine(model=sys.argv[1], context_length=512, max_total_tokens=4096, stats_log_interval=0)
untraced = eng.generate("hello", {"max_new_tokens": 2})
eng.observer.refresh()
off = {"tracer": tracing.active_tracer() is None, "sdk_imported": "opentelemetry.sdk" in sys.modules}

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
schema = {"type": "object", "properties": {k: {"type": "string", "maxLength": 8} for k in "abcdefghij"},
          "required": list("abcdefghij"), "additionalProperties": False}
with trace.get_tracer("test").start_as_current_span("caller") as caller:
    constrained = eng.generate("Fill in:", {"json_schema": json.dumps(schema), "max_new_tokens": 12,
                                             "temperature": 0})
plain = eng.generate("Once upon a time", {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})

from radixgen.runtime.server import create_app

async def post():
    transport = httpx.ASGITransport(app=create_app(eng, model_name="tiny"))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await client.post("/generate", headers={"traceparent": "00-%s-%s-01" % (sys.argv[2], sys.argv[3])},
                              json={"text": "Hi", "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
        return r.json()

http = asyncio.run(post())
eng.observer.refresh()
eng.shutdown()
spans = [{"name": s.name, "trace": format(s.context.trace_id, "032x"), "id": format(s.context.span_id, "016x"),
          "parent": format(s.parent.span_id, "016x") if s.parent else None, "start": s.start_time,
          "end": s.end_time, "attrs": {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.attributes.items()},
          "status": s.status.status_code.name} for s in exporter.get_finished_spans()]
print(json.dumps({"off": off, "spans": spans, "caller": format(caller.get_span_context().span_id, "016x"),
                  "caller_trace": format(caller.get_span_context().trace_id, "032x"),
                  "metas": {k: o["meta_info"] for k, o in
                            [("untraced", untraced), ("constrained", constrained), ("plain", plain), ("http", http)]}}))
"""


@pytest.fixture(scope="module")
def run(tiny_models):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_models["llama"]), TRACE_ID, PARENT_ID],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def tree(run: dict, meta: dict) -> tuple[dict, dict[str, dict]]:
    """The request span of `meta`'s request and its children by name."""
    (root,) = [s for s in run["spans"] if s["name"] == "radixgen.request" and s["attrs"]["gen_ai.response.id"]
               == meta["id"]]
    return root, {s["name"]: s for s in run["spans"] if s["parent"] == root["id"]}


def test_tracing_off_costs_nothing(run):
    assert run["off"] == {"tracer": True, "sdk_imported": False}
    untraced = run["metas"]["untraced"]["id"]
    assert all(s["attrs"].get("gen_ai.response.id") != untraced for s in run["spans"])


def test_request_span_tree_follows_the_request(run):
    meta = run["metas"]["constrained"]
    root, kids = tree(run, meta)
    assert root["trace"] == run["caller_trace"] and root["parent"] == run["caller"]  # under the caller's span
    assert set(kids) == {"radixgen.grammar_compile", "radixgen.queue", "radixgen.prefill", "radixgen.decode"}
    g, q, p, d = (kids[f"radixgen.{n}"] for n in ("grammar_compile", "queue", "prefill", "decode"))
    assert root["start"] == g["start"] < g["end"] <= q["start"] == g["end"] <= q["end"] == p["start"]
    assert p["end"] == d["start"] <= d["end"] == root["end"]
    ms = 1e6  # ns: times are rebuilt from meta_info's seconds
    assert abs((q["end"] - root["start"]) - meta["queue_time"] * 1e9) < ms
    assert abs((p["end"] - root["start"]) - meta["first_token_latency"] * 1e9) < ms
    assert abs((root["end"] - root["start"]) - meta["e2e_latency"] * 1e9) < ms
    a = root["attrs"]
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"], a["radixgen.cached_tokens"]) == (
        meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"])
    assert a["radixgen.constraint"] == "json_schema" and a["gen_ai.response.finish_reasons"] == [
        meta["finish_reason"]["type"]]
    assert a["gen_ai.latency.time_to_first_token"] == pytest.approx(meta["first_token_latency"])
    assert root["status"] == "UNSET"


def test_untraced_caller_starts_a_trace_and_http_joins_the_callers(run):
    root, kids = tree(run, run["metas"]["plain"])
    assert root["parent"] is None and root["trace"] != run["caller_trace"]
    assert set(kids) == {"radixgen.queue", "radixgen.prefill", "radixgen.decode"}  # no grammar, nothing waited
    assert all(k["trace"] == root["trace"] for k in kids.values())
    root, kids = tree(run, run["metas"]["http"])
    assert (root["trace"], root["parent"]) == (TRACE_ID, PARENT_ID)
