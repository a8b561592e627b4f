"""Observability: Prometheus metrics under SGLang's names, request and batch-stats logs, OpenTelemetry traces.

Every Engine owns one `Observer` (observer.py). It wraps each request's output channel so that the
request's final `meta_info` becomes a `RequestRecord` (records.py), and hands records to a
background thread that feeds

- `metrics.py`: prometheus_client series with SGLang's names, labels and buckets (`sglang:*`) plus
  radixgen's own (`radixgen:*`); `exposition.py` renders them for GET /metrics, aggregating every
  process's files when `PROMETHEUS_MULTIPROC_DIR` is set;
- `request_log.py`: one line per finished request at info level (bodies with `log_requests`);
- `tracing.py`: spans (request, queue wait, prefill, decode, grammar compile) when OpenTelemetry is
  installed and configured, nothing at all otherwise.

The same thread reads `Engine.get_stats()` every `stats_log_interval` seconds to refresh the
scheduler gauges and print SGLang-style "Prefill batch" / "Decode batch" lines (`batch_log.py`).
`log_format.py` sets up the process's logging (text or one JSON object per line) for the CLI.
Nothing here runs on the scheduler thread but one queue append per finished request.
"""
