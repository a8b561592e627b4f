"""Metrics of engine replicas in separate processes, aggregated through prometheus_client's multiprocess mode.

Two replica processes (each a real Engine over a tiny random-weight llama, labelled dp_rank 0 and 1)
serve requests with `PROMETHEUS_MULTIPROC_DIR` set, then exit; a third process with no engine renders
/metrics from the directory. Counters and histograms must add up to what both replicas' requests
reported in their meta_info; each replica keeps its own gauges under its dp_rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

REPLICA = r"""
import json, sys
from radixgen.runtime.engine import Engine

eng = Engine(model=sys.argv[1], context_length=512, max_total_tokens=4096, stats_log_interval=0)
eng.observer.set_labels(model_name="tiny", dp_rank=int(sys.argv[2]))
outs = eng.generate([f"replica {sys.argv[2]} prompt {i}" for i in range(int(sys.argv[3]))],
                    {"max_new_tokens": 4, "temperature": 0})
eng.observer.refresh()
eng.shutdown()
print(json.dumps([o["meta_info"] for o in outs]))
"""
RENDER = r"""
from radixgen.runtime.observability.exposition import render
print(render(None)[0].decode())
"""


def run(code: str, *args: str, env: dict) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_replica_processes_add_up(tiny_models, tmp_path):
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path), TOKENIZERS_PARALLELISM="false")
    model = str(tiny_models["llama"])
    procs = [subprocess.Popen([sys.executable, "-c", REPLICA, model, str(rank), str(n)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for rank, n in ((0, 2), (1, 3))]
    metas = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        metas += json.loads(out.strip().splitlines()[-1])
    samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(run(RENDER, env=env))
               for s in f.samples]

    def total(name: str, **labels: str) -> float:
        return sum(v for n, ls, v in samples if n == name and labels.items() <= ls.items())

    assert total("sglang:num_requests_total") == len(metas) == 5
    assert total("sglang:prompt_tokens_total") == sum(m["prompt_tokens"] for m in metas)
    assert total("sglang:generation_tokens_total") == sum(m["completion_tokens"] for m in metas)
    assert total("sglang:e2e_request_latency_seconds_count") == 5
    assert total("sglang:e2e_request_latency_seconds_sum") == pytest.approx(sum(m["e2e_latency"] for m in metas))
    assert total("sglang:inter_token_latency_seconds_count") == sum(m["completion_tokens"] - 1 for m in metas)
    for rank, n in (("0", 2), ("1", 3)):  # each replica's own gauges and counters, under its dp_rank
        assert total("sglang:max_total_num_tokens", dp_rank=rank) == 4096
        assert total("sglang:num_running_reqs", dp_rank=rank) == 0
        assert total("sglang:queue_time_seconds_count", dp_rank=rank) == n
    assert {ls["dp_rank"] for n, ls, _ in samples if n == "sglang:token_usage"} == {"0", "1"}
