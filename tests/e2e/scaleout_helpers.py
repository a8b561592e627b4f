"""Helpers of the scale-out e2e tests: a `radixgen` subcommand in a subprocess on a free port, /generate."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from radixgen.runtime.distributed.launch import free_port

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


@dataclass
class Service:
    url: str
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(args: list[str], log: Path, timeout: float = 300) -> Service:
    port = free_port()
    cmd = [sys.executable, "-m", "radixgen.runtime.cli", *args, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    svc = Service(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(svc.url + "/health", timeout=2).status_code == 200:
                return svc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    svc.stop()
    raise TimeoutError(f"{args[0]} not healthy after {timeout} s:\n{log.read_text()[-3000:]}")


def generate(url: str, text: str, params: dict = GREEDY) -> httpx.Response:
    return httpx.post(url + "/generate", json={"text": text, "sampling_params": params}, timeout=300)
