"""The real `radixgen serve` in a subprocess (127.0.0.1, a free port), shared by the e2e tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

MODEL = "smollm2-135m-instruct"  # the name the default model is served under


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `python -m radixgen.runtime.cli serve` subprocess."""

    def __init__(self, *args: str, log: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "radixgen.runtime.cli", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), *args]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"server not healthy after {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # ---- small JSON helpers (urllib, so they do not depend on the openai client)
    def get(self, path: str, headers: dict | None = None) -> tuple[int, str]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[Server]:
    srv = Server("--num-threads", "1", log=tmp_path_factory.mktemp("server") / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def start_server(tmp_path_factory):
    """A function starting another server with extra CLI args (stopped at the end of the session)."""
    started: list[Server] = []

    def start(*args: str) -> Server:
        srv = Server(*args, log=tmp_path_factory.mktemp("server") / "server.log")
        started.append(srv)
        srv.wait_ready()
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def has_constraints(server) -> bool:
    """Whether the engine enforces grammar constraints (a regex "a" must give exactly "a")."""
    status, out = server.post("/generate", {"text": "x", "sampling_params": {"regex": "a", "max_new_tokens": 3}})
    return status == 200 and out["text"] == "a"


@pytest.fixture
def needs_constraints(has_constraints) -> None:
    # the engine enforces constraints: a probe that comes back unconstrained is a regression, not a skip
    assert has_constraints, "/generate with regex 'a' did not return exactly 'a'"
