"""Running scaled out from the command line: `serve --dp-size N`, `serve --node-rank K`, `router`.

`serve --dp-size N` starts N replicas (each `radixgen serve` on a free local port, its own engine, KV
pool and radix cache, with the same engine flags and dp_size 1), waits until all answer /health, then
serves the router app on the public host and port; the replicas end with it. `serve --node-rank K`
(K > 0) runs that machine's tensor-parallel ranks. `router --worker-urls ...` serves the router app
over replicas started elsewhere.

    python -m radixgen.runtime.router.replicas <serve arguments>

is how a replica is started: `radixgen serve` that also exits when the process that started it does.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from dataclasses import MISSING, fields
from typing import Any

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.config_flags import config_kwargs, engine_kwargs
from radixgen.runtime.distributed.launch import free_port, run_node
from radixgen.runtime.router.config import RouterConfig

STARTUP_TIMEOUT_S = 900.0


def engine_argv(kwargs: dict[str, Any]) -> list[str]:
    """The `radixgen serve` flags that give an EngineConfig with these fields (defaults left out)."""
    argv: list[str] = []
    for f in fields(EngineConfig):
        value = kwargs.get(f.name, f.default)
        default = f.default if f.default is not MISSING else None
        if value == default or value is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    return argv


def serve_scaled_out(args: argparse.Namespace) -> int:
    """`radixgen serve` with node_rank > 0 or dp_size > 1; the exit code."""
    config = EngineConfig(**engine_kwargs(args))
    if config.node_rank > 0:
        return run_node(config)
    if config.nnodes > 1 or config.dist_init_addr is not None:
        raise SystemExit("radixgen serve: --dp-size > 1 runs its replicas on this machine; for replicas on several "
                         "machines start `radixgen serve` on each and `radixgen router --worker-urls ...` in front")
    replicas = start_replicas(args, config)
    try:
        urls = [url for url, _ in replicas]
        wait_healthy(replicas)
        from radixgen.runtime.router.app import create_router_app

        app = create_router_app(urls, RouterConfig(**config_kwargs(args, RouterConfig)))
        serve_app(app, args, f"routing over {config.dp_size} replicas {urls}")
        return 0
    finally:
        stop_replicas([p for _, p in replicas])


def start_replicas(args: argparse.Namespace, config: EngineConfig) -> list[tuple[str, subprocess.Popen]]:
    kwargs = dict(engine_kwargs(args), dp_size=1)
    extra = ["--log-level", args.log_level]
    if args.api_key:
        extra += ["--api-key", args.api_key]
    if args.served_model_name:
        extra += ["--served-model-name", args.served_model_name]
    extra += ["--tool-call-parser", args.tool_call_parser]
    if args.reasoning_parser:
        extra += ["--reasoning-parser", args.reasoning_parser]
    out = []
    for _ in range(config.dp_size):
        port = free_port()
        cmd = [sys.executable, "-m", "radixgen.runtime.router.replica_process", "--host", "127.0.0.1",
               "--port", str(port), *extra, *engine_argv(kwargs)]
        out.append((f"http://127.0.0.1:{port}", subprocess.Popen(cmd, stdin=subprocess.DEVNULL)))
    return out


def wait_healthy(replicas: list[tuple[str, subprocess.Popen]], timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Wait until every replica answers /health; fail if one exits or the time runs out."""
    import httpx

    pending = dict(replicas)
    deadline = time.monotonic() + timeout
    while pending:
        for url, proc in list(pending.items()):
            if proc.poll() is not None:
                raise SystemExit(f"radixgen serve: replica {url} exited with code {proc.returncode} while starting")
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    del pending[url]
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise SystemExit(f"radixgen serve: replicas {sorted(pending)} did not start within {timeout:.0f} s")
        time.sleep(0.5)


def stop_replicas(procs: list[subprocess.Popen], timeout: float = 15.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def serve_app(app: Any, args: argparse.Namespace, what: str) -> None:
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=5, access_log=args.log_level == "debug")
    print(f"radixgen: router at http://{args.host}:{args.port}, {what}", flush=True)
    uvicorn.Server(config).run()


def run_router(args: argparse.Namespace) -> None:
    """`radixgen router --worker-urls ...`."""
    from radixgen.runtime.router.app import create_router_app

    app = create_router_app(args.worker_urls, RouterConfig(**config_kwargs(args, RouterConfig)))
    serve_app(app, args, f"routing over {args.worker_urls}")
