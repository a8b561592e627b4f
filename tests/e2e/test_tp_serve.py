"""Tensor parallelism from the command line: `radixgen serve --tp-size 3` on SmolLM2 answers with tp=1's
greedy outputs, and the multi-node flags (`--nnodes 2 --node-rank 0|1 --dist-init-addr`) work as two
processes on this machine, node 1 exiting when node 0 stops."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from scaleout_helpers import GREEDY, generate, start

from radixgen.runtime.distributed.launch import free_port
from radixgen.runtime.engine import Engine

PROMPTS = ["The three primary colors are", "def fibonacci(n):", "Paris is the capital of"]


@pytest.mark.slow
def test_serve_tp3_greedy_equals_tp1(engine, tmp_path):
    expected = [o["output_ids"] for o in engine.generate(PROMPTS, GREEDY)]
    svc = start(["serve", "--tp-size", "3", "--max-total-tokens", "4096", "--max-running-requests", "8"],
                tmp_path / "serve.log")
    try:
        got = [generate(svc.url, p).json()["output_ids"] for p in PROMPTS]
    finally:
        svc.stop()
    assert got == expected


def test_two_nodes_on_one_machine(tiny_models, tmp_path):
    model = str(tiny_models["qwen2"])
    addr = f"127.0.0.1:{free_port()}"
    flags = ["--model", model, "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr, "--num-threads", "1"]
    node1 = subprocess.Popen([sys.executable, "-m", "radixgen.runtime.cli", "serve", *flags, "--node-rank", "1"],
                             stdout=(tmp_path / "node1.log").open("w"), stderr=subprocess.STDOUT)
    try:
        node0 = start(["serve", *flags, "--node-rank", "0"], tmp_path / "node0.log")
        try:
            with Engine(model=model) as ref:
                expected = [o["output_ids"] for o in ref.generate(PROMPTS, GREEDY)]
            got = [generate(node0.url, p).json()["output_ids"] for p in PROMPTS]
            assert httpx.get(node0.url + "/health").status_code == 200
        finally:
            node0.stop()
        assert node1.wait(60) == 0, (tmp_path / "node1.log").read_text()[-2000:]
    finally:
        if node1.poll() is None:
            node1.kill()
    assert got == expected
