"""Optional OpenTelemetry traces: one span tree per finished request, or nothing at all.

Tracing is on when the `opentelemetry` API is installed and the process has an SDK tracer provider:
one the application installed itself (e.g. `opentelemetry-instrument radixgen serve ...`, or a
provider set in the program that embeds the Engine), or the one `setup()` installs when an OTLP
endpoint is configured (`--otlp-traces-endpoint`, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
`OTEL_EXPORTER_OTLP_ENDPOINT`; protocol from `OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`, `http/protobuf`
by default, `grpc` too; service name from `OTEL_SERVICE_NAME`, default "radixgen"). Otherwise every
entry point returns at once: no span objects, no context capture.

A request's spans are made when it finishes, from its timestamps (so nothing runs per token):

    radixgen.request           created -> finished; GenAI attributes (tokens, finish reason, latencies)
      radixgen.grammar_compile   created -> its grammar was compiled (only when it had to wait)
      radixgen.queue             -> first scheduled
      radixgen.prefill           scheduled -> first token
      radixgen.decode            first token -> finished (two or more tokens)

The request span's parent is the context current where the request was made: the caller's span, or
for HTTP requests the W3C `traceparent` header, which `TraceContextMiddleware` puts in the context.
"""

from __future__ import annotations

import os
from functools import cache
from types import ModuleType
from typing import Any

from radixgen.runtime.observability.records import RequestRecord

ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
INSTALL_HINT = "pip install opentelemetry-sdk opentelemetry-exporter-otlp"


@cache
def _trace_api() -> ModuleType | None:
    """`opentelemetry.trace`, or None when OpenTelemetry is not installed (looked up once)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


def configured_endpoint(endpoint: str | None) -> str | None:
    """The OTLP endpoint to export to: `endpoint`, else the standard environment variables."""
    return endpoint or next((os.environ[k] for k in ENDPOINT_ENVS if os.environ.get(k)), None)


def setup(endpoint: str | None) -> Any | None:
    """Export spans over OTLP when an endpoint is configured and the process has no tracer provider
    yet; returns the provider installed here (to flush at shutdown), else None. Raises RuntimeError
    naming the packages to install when an endpoint is set but the SDK or exporter is missing."""
    target = configured_endpoint(endpoint)
    if target is None:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        exporter_class = _exporter_class()
    except ImportError as e:
        raise RuntimeError(f"an OTLP traces endpoint is set ({target}) but OpenTelemetry's SDK or OTLP exporter "
                           f"is not installed ({e.name}): {INSTALL_HINT}") from None
    if _has_sdk_provider(trace):
        return None  # the application configured tracing itself: its provider gets our spans
    if endpoint is not None and exporter_class.__module__.endswith("http.trace_exporter"):
        endpoint = _http_traces_url(endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME",
                                                                                        "radixgen")}))
    provider.add_span_processor(BatchSpanProcessor(exporter_class(endpoint=endpoint)))  # None: from the env
    trace.set_tracer_provider(provider)
    return provider


def _exporter_class() -> type:
    """The OTLP span exporter of the configured protocol (`http/protobuf` unless `grpc` is asked for)."""
    protocol = next((os.environ[k] for k in PROTOCOL_ENVS if os.environ.get(k)), "http/protobuf")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter


def _http_traces_url(endpoint: str) -> str:
    """A bare `http://host:port` means OTLP/HTTP's traces path there, as for OTEL_EXPORTER_OTLP_ENDPOINT."""
    if "://" in endpoint and "/" not in endpoint.split("://", 1)[1].rstrip("/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def _has_sdk_provider(trace: ModuleType) -> bool:
    """Whether a real tracer provider is installed (the API's default is a proxy that records nothing)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def active_tracer() -> Any | None:
    """radixgen's tracer when tracing is on, else None (cheap: no OpenTelemetry call when it is absent)."""
    trace = _trace_api()
    if trace is None or not _has_sdk_provider(trace):
        return None
    return trace.get_tracer("radixgen")


def capture_context() -> Any | None:
    """The OpenTelemetry context current on this thread / task (the future request span's parent; an
    empty context when there is none), or None when tracing is off."""
    if active_tracer() is None:
        return None
    from opentelemetry import context

    return context.get_current()


def emit_request_spans(tracer: Any, rec: RequestRecord, parent: Any | None) -> None:
    """The span tree of one finished request (see the module docstring)."""
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    start = rec.started_at
    end = rec.finished_at

    def ns(t: float) -> int:
        return int(t * 1e9)

    p = rec.params
    attrs: dict[str, Any] = {
        "gen_ai.response.id": rec.rid, "gen_ai.usage.input_tokens": rec.prompt_tokens,
        "gen_ai.usage.output_tokens": rec.completion_tokens, "gen_ai.response.finish_reasons": [rec.finish_reason],
        "gen_ai.request.max_tokens": p.max_new_tokens, "gen_ai.request.temperature": p.temperature,
        "gen_ai.request.top_p": p.top_p, "gen_ai.request.top_k": p.top_k, "gen_ai.latency.e2e": rec.e2e,
        "radixgen.cached_tokens": rec.cached_tokens, "radixgen.constraint": rec.constraint or "none",
        "radixgen.stream": rec.stream,
    }
    if rec.ttft is not None:
        attrs["gen_ai.latency.time_to_first_token"] = rec.ttft
    if rec.queue_time is not None:
        attrs["gen_ai.latency.time_in_queue"] = rec.queue_time
    root = tracer.start_span("radixgen.request", context=parent, start_time=ns(start), attributes=attrs)
    if rec.finish_reason == "abort":
        root.set_status(Status(StatusCode.ERROR, rec.finish_message or "aborted"))
    inside = trace.set_span_in_context(root)
    queued_from = start
    stages: list[tuple[str, float, float]] = []
    if rec.grammar_wait is not None:
        queued_from = start + min(rec.grammar_wait, rec.queue_time if rec.queue_time is not None else rec.e2e)
        stages.append(("radixgen.grammar_compile", start, queued_from))
    if rec.queue_time is not None:
        scheduled = start + rec.queue_time
        stages.append(("radixgen.queue", queued_from, scheduled))
        if rec.ttft is not None:
            stages.append(("radixgen.prefill", scheduled, start + rec.ttft))
            if rec.completion_tokens > 1:
                stages.append(("radixgen.decode", start + rec.ttft, end))
    for name, a, b in stages:
        tracer.start_span(name, context=inside, start_time=ns(a)).end(end_time=ns(b))
    root.end(end_time=ns(end))


class TraceContextMiddleware:
    """Pure-ASGI middleware: while tracing is on, an HTTP request's W3C trace context headers
    (`traceparent`, `tracestate`) become the current context, so its engine requests join that trace."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or active_tracer() is None:
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, propagate

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        token = context.attach(propagate.extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            context.detach(token)
