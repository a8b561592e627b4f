"""`sgl.Runtime`: SGLang's launcher of a local server, here a `radixgen serve` child process.

    runtime = sgl.Runtime(model_path="HuggingFaceTB/SmolLM2-135M-Instruct", max_total_tokens=8192)
    sgl.set_default_backend(runtime)        # programs talk to it over HTTP (its RuntimeEndpoint)
    ...
    runtime.shutdown()                      # also at interpreter exit, or `with sgl.Runtime(...) as rt:`

Keyword arguments become `radixgen serve` flags (`max_total_tokens=8192` -> `--max-total-tokens 8192`,
`disable_radix_cache=True` -> `--disable-radix-cache`); an unknown one stops the server at once and
the error names it. The server's output goes to `runtime.log_path`.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

from radixgen.common.exit_hooks import ENGINES, at_exit
from radixgen.lang.backends.endpoint import RuntimeEndpoint


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _flags(server_args: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in server_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            out += [flag, str(value)]
    return out


class Runtime:
    """A `radixgen serve` process on a free local port, used through `self.endpoint`."""

    def __init__(self, model_path: str | None = None, *, log_level: str = "error", launch_timeout: float = 300.0,
                 host: str = "127.0.0.1", port: int | None = None, api_key: str | None = None,
                 **server_args: Any) -> None:
        if "model" in server_args:
            if model_path is not None:
                raise TypeError("give model_path or model, not both")
            model_path = server_args.pop("model")
        self.port = port or _free_port(host)
        self.url = f"http://{host}:{self.port}"
        fd, self.log_path = tempfile.mkstemp(prefix="radixgen-runtime-", suffix=".log")
        os.close(fd)
        cmd = [sys.executable, "-m", "radixgen", "serve", "--host", host, "--port", str(self.port),
               "--log-level", log_level, *_flags(server_args)]
        if model_path is not None:
            cmd += ["--model", str(model_path)]
        if api_key is not None:
            cmd += ["--api-key", api_key]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.pid = self.process.pid
        # stopped at exit after the programs using it have finished (common/exit_hooks.py)
        self._cancel_exit_hook = at_exit(self.shutdown, ENGINES)
        try:
            self._wait_healthy(launch_timeout)
        except BaseException:
            self.shutdown()
            raise
        self.endpoint = RuntimeEndpoint(self.url, api_key=api_key)

    def _log_tail(self, chars: int = 2000) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"radixgen serve exited with code {self.process.returncode} while starting:\n"
                                   f"{self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"radixgen serve did not become healthy within {timeout:.0f} s "
                           f"(launch_timeout); its log:\n{self._log_tail()}")

    # ---- SGLang's Runtime methods
    def generate(self, prompt: str | list[str], sampling_params: dict | None = None, return_logprob: bool = False,
                 logprob_start_len: int | None = None, top_logprobs_num: int | None = None) -> str:
        """POST /generate; returns the response as a JSON string (as SGLang's Runtime does)."""
        body: dict[str, Any] = {"text": prompt, "sampling_params": sampling_params or {},
                                "return_logprob": return_logprob}
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        if top_logprobs_num is not None:
            body["top_logprobs_num"] = top_logprobs_num
        return json.dumps(self.endpoint.http.post("/generate", body))

    async def async_generate(self, prompt: str, sampling_params: dict | None = None) -> AsyncIterator[str]:
        """Stream the text of one prompt as it is generated (new text per item)."""
        chunks = self.endpoint.engine.generate(prompt=prompt, sampling_params=sampling_params or {}, stream=True)
        loop, end = asyncio.get_running_loop(), object()
        try:
            while True:
                chunk = await loop.run_in_executor(None, next, chunks, end)
                if chunk is end:
                    return
                if chunk["text"]:
                    yield chunk["text"]
        finally:
            chunks.close()

    add_request = generate

    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)

    def get_tokenizer(self) -> Any:
        """The server's tokenizer (encode / decode / apply_chat_template over HTTP)."""
        return self.endpoint.tokenizer

    def get_server_info(self) -> dict:
        return self.endpoint.get_server_info()

    def shutdown(self) -> None:
        """Stop the server process (idempotent)."""
        proc = getattr(self, "process", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        cancel = getattr(self, "_cancel_exit_hook", None)
        if cancel is not None:
            cancel()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"Runtime({self.url!r}, pid={self.pid})"
