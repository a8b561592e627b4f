"""Data parallelism: `radixgen serve --dp-size 2` (two replicas behind the cache-aware router) and
`radixgen router --worker-urls` over the same replicas, on a tiny random model. Oracles: an in-process
Engine (dp=1) for greedy outputs, the replicas' own cached-token counts for prefix affinity, and the
replica processes themselves, one of which is killed mid-run."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from scaleout_helpers import GREEDY, generate, start

from radixgen.runtime.engine import Engine


@pytest.fixture(scope="module")
def tiny(tiny_models) -> str:
    return str(tiny_models["llama"])


@pytest.fixture(scope="module")
def dp(tiny, tmp_path_factory):
    svc = start(["serve", "--model", tiny, "--dp-size", "2", "--num-threads", "1", "--max-total-tokens", "8192",
                 "--worker-max-inflight", "2", "--health-check-interval", "0.5"],
                tmp_path_factory.mktemp("dp") / "serve.log")
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def reference(tiny):
    eng = Engine(model=tiny, max_total_tokens=8192)
    yield eng
    eng.shutdown()


def test_dp2_greedy_outputs_equal_dp1(dp, reference):
    prompts = [f"Request {i}: " + "lorem ipsum dolor " * (2 + 3 * i) for i in range(6)]
    expected = [o["output_ids"] for o in reference.generate(prompts, GREEDY)]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda p: generate(dp.url, p), prompts))
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert [r.json()["output_ids"] for r in answers] == expected
    assert len({r.headers["x-radixgen-worker"] for r in answers}) == 2  # both replicas served


def test_requests_sharing_a_prefix_land_on_the_same_replica(dp):
    systems = {"a": "You are a tax adviser. " * 12, "b": "You are a poet who writes haiku. " * 10}
    placed: dict[str, set[str]] = {"a": set(), "b": set()}
    cached: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(4):
        for name, system in systems.items():
            r = generate(dp.url, system + f"User {i} asks something.")
            placed[name].add(r.headers["x-radixgen-worker"])
            cached[name].append(r.json()["meta_info"]["cached_tokens"])
    assert len(placed["a"]) == 1 and len(placed["b"]) == 1 and placed["a"] != placed["b"]
    assert min(cached["a"][1:] + cached["b"][1:]) >= 40  # each replica reused the system prompt it holds
    metrics = httpx.get(dp.url + "/metrics").text
    routed = sum(float(v) for v in re.findall(r'radixgen_router_requests_routed_total\{reason="prefix",'
                                               r'worker="[^"]+"\} (\S+)', metrics))
    assert routed >= 6
    assert re.search(r"^radixgen_router_prefix_routed_ratio (\S+)", metrics, re.M)


def _replica_pids(parent: int) -> dict[str, int]:
    """URL -> pid of the replicas `radixgen serve --dp-size` started (from /proc)."""
    out = {}
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    for pid in children:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        port = args[args.index(b"--port") + 1].decode()
        out[f"http://127.0.0.1:{port}"] = int(pid)
    return out


def test_router_cli_survives_a_replica_dying_mid_run(dp, tmp_path_factory):
    urls = [w["url"] for w in httpx.get(dp.url + "/workers").json()]
    pids = _replica_pids(dp.proc.pid)
    router = start(["router", "--worker-urls", *urls, "--worker-max-inflight", "2", "--health-check-interval", "0.5",
                    "--policy", "round_robin"], tmp_path_factory.mktemp("router") / "router.log")
    try:
        params = {"temperature": 0, "max_new_tokens": 120, "ignore_eos": True}
        with ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(generate, router.url, f"Story {i}: once upon a time", params) for i in range(12)]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # wait until the victim has requests in flight and queued
                victim = next((w for w in httpx.get(router.url + "/workers").json()
                               if w["in_flight"] == 2 and w["queued"] >= 1), None)
                if victim is not None:
                    break
                time.sleep(0.05)
            assert victim is not None, "no replica had queued requests"
            os.kill(pids[victim["url"]], signal.SIGSTOP)  # frozen: none of its requests can finish now
            frozen = next(w for w in httpx.get(router.url + "/workers").json() if w["url"] == victim["url"])
            os.kill(pids[victim["url"]], signal.SIGKILL)
            answers = [f.result(timeout=120) for f in futures]
        failed = [r for r in answers if r.status_code != 200]
        assert frozen["queued"] >= 1 and len(failed) <= frozen["in_flight"]  # only what had started there
        for r in failed:
            assert r.status_code == 502 and r.json()["error"]["code"] == "worker_failed", r.text
            assert victim["url"] in r.json()["error"]["message"]
        assert len(answers) - len(failed) >= 10 and all(len(r.json()["output_ids"]) == 120 for r in answers
                                                         if r.status_code == 200)
        workers = {w["url"]: w for w in httpx.get(router.url + "/workers").json()}
        assert not workers[victim["url"]]["healthy"]
        assert generate(router.url, "still there?").status_code == 200
        assert httpx.get(router.url + "/health").json()["workers_in_rotation"] == 1
        assert re.search(r"^radixgen_router_rerouted_requests_total ([1-9]\S*)",
                         httpx.get(router.url + "/metrics").text, re.M)
    finally:
        router.stop()
