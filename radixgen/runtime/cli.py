"""The `radixgen` command: `serve` (the HTTP server) and `run` (a Python file with @function programs).

    radixgen serve [--model M] [--host 127.0.0.1] [--port 30000] [--api-key K] [every EngineConfig field]
                   [every ServerOptions field: request limits, --public-metrics]
    radixgen router --worker-urls URL [URL ...] [--host H] [--port P] [every RouterConfig field]
    radixgen run [--endpoint URL] path/to/program.py [program args ...]
    radixgen --version                 (also `python -m radixgen ...`)

Start-up problems the user can fix (a model that cannot be found, an unavailable device, a bad
setting) end with one `radixgen serve: error: ...` line and exit status 1, not a traceback.

`serve --dp-size N` starts N replicas behind a router in this process; `serve --node-rank K` (K > 0)
runs that machine's tensor-parallel ranks for node 0's engine (see docs/scaling.md).

The engine flags are generated from `EngineConfig`'s fields (so a flag and a field never drift): the
name with dashes, the type and choices from the annotation, the help from the docstring under the
field. A bool field defaulting to False is a switch (`--disable-radix-cache`); one defaulting to True
gets a `--no-...` form.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import runpy
import sys
import time
from collections.abc import Iterator
from typing import Any

from radixgen.runtime.config_flags import add_config_flags, add_engine_flags, config_kwargs, engine_kwargs
from radixgen.runtime.router.config import RouterConfig
from radixgen.runtime.server.options import ServerOptions
from radixgen.runtime.server.parsers import REASONING_PARSER_CHOICES, TOOL_PARSER_CHOICES


def build_parser() -> argparse.ArgumentParser:
    from radixgen import __version__

    parser = argparse.ArgumentParser(prog="radixgen", description="radixgen: structured generation runtime.")
    parser.add_argument("--version", action="version", version=f"radixgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{serve,router,run}")
    sub.required = True
    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                           description="Serve a model: /v1/chat/completions, /v1/completions, /v1/models, "
                                       "/generate, /flush_cache, /metrics, /health.")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=30000, help="port to bind (default: 30000)")
    serve.add_argument("--api-key", default=os.environ.get("RADIXGEN_API_KEY"),
                       help="require 'Authorization: Bearer <key>' on every route but /health "
                            "(default: $RADIXGEN_API_KEY, else no key; prefer the variable: flags show in ps)")
    serve.add_argument("--served-model-name", default=None,
                       help="the model id clients pass as `model` (default: derived from --model)")
    serve.add_argument("--tool-call-parser", default="auto", choices=TOOL_PARSER_CHOICES,
                       help="format of the model's tool calls (default: auto, the one its chat template uses)")
    serve.add_argument("--reasoning-parser", default=None, choices=REASONING_PARSER_CHOICES,
                       help="split a thinking model's <think>...</think> into reasoning_content (default: none)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="log level of the server (default: info: load progress, request and batch lines)")
    serve.add_argument("--log-format", default="text", choices=["text", "json"],
                       help="log lines as text or as one JSON object each (default: text)")
    serve.add_argument("--skip-warmup", action="store_true",
                       help="accept requests right after loading, without first running one short request "
                            "(the first request then pays for the warm-up, ~1-8 s)")
    add_engine_flags(serve, aliases={"model": ["--model-path"]})
    add_config_flags(serve, ServerOptions, "server options (ServerOptions fields: request limits, auth)")
    add_config_flags(serve, RouterConfig, "router options (RouterConfig fields; with --dp-size > 1)")
    router = sub.add_parser("router", help="route the serving API over running `radixgen serve` replicas",
                            description="A cache-aware router in front of `radixgen serve` replicas (e.g. on "
                                        "other machines): the same routes as one server, plus /workers.")
    router.add_argument("--worker-urls", nargs="+", required=True, metavar="URL",
                        help="base URLs of the replicas, e.g. http://10.0.0.5:30000")
    router.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    router.add_argument("--port", type=int, default=30000, help="port to bind (default: 30000)")
    router.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                        help="log level of the router (default: warning)")
    add_config_flags(router, RouterConfig, "router options (RouterConfig fields)")
    run = sub.add_parser("run", help="run a Python file (e.g. @function programs) with runpy",
                         description="Run a Python file as __main__; with --endpoint its programs default to "
                                     "that server (RuntimeEndpoint).")
    run.add_argument("--endpoint", default=None, help="base URL of a `radixgen serve` to use as default backend")
    run.add_argument("--api-key", default=None, help="API key for --endpoint")
    run.add_argument("program", help="path to the Python file")
    run.add_argument("program_args", nargs=argparse.REMAINDER, help="arguments passed to the program")
    return parser


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    if args.node_rank > 0 or args.dp_size > 1:
        from radixgen.runtime.router.replicas import serve_scaled_out  # lazy: httpx, subprocesses

        sys.exit(serve_scaled_out(args))

    from radixgen.runtime.engine import Engine
    from radixgen.runtime.observability.log_format import configure_logging
    from radixgen.runtime.server import create_app
    from radixgen.runtime.server.memory import freeze_startup_heap
    from radixgen.runtime.server.warmup import warm_up

    configure_logging(args.log_level, args.log_format)
    t0 = time.perf_counter()
    try:
        options = ServerOptions(**config_kwargs(args, ServerOptions))  # checked before the model loads
        engine = Engine(**engine_kwargs(args))
    except (FileNotFoundError, ValueError, TypeError) as e:
        raise SystemExit(f"radixgen serve: error: {e}") from None
    try:
        app = create_app(engine, api_key=args.api_key, model_name=args.served_model_name, options=options,
                         tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser)
        state = app.state.radixgen
        if not args.skip_warmup:
            warm_up(engine, state)
        logging.getLogger("radixgen.server").debug("froze %d start-up objects out of GC", freeze_startup_heap())

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                state.draining = True  # new requests get 503 while in-flight ones finish
                super().handle_exit(sig, frame)

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                with super().capture_signals():
                    try:
                        yield
                    finally:  # uvicorn re-raises the stopping signal after this: shut down first
                        engine.shutdown()

        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                timeout_graceful_shutdown=5, access_log=args.log_level == "debug",
                                **({"log_config": None} if args.log_format == "json" else {}))  # json: ours
        print(f"radixgen: serving {state.model_name!r} at http://{args.host}:{args.port} "
              f"(ready in {time.perf_counter() - t0:.1f} s)", flush=True)
        Server(config).run()
    finally:
        engine.shutdown()


def run_program(args: argparse.Namespace) -> None:
    if args.endpoint:
        import radixgen
        from radixgen.lang.backends.endpoint import RuntimeEndpoint

        radixgen.set_default_backend(RuntimeEndpoint(args.endpoint, api_key=args.api_key))
    if not os.path.isfile(args.program):
        raise SystemExit(f"radixgen run: no such file: {args.program}")
    sys.argv = [args.program, *args.program_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.program)))
    runpy.run_path(args.program, run_name="__main__")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        serve(args)
    elif args.command == "router":
        from radixgen.runtime.router.replicas import run_router  # lazy: httpx

        run_router(args)
    else:
        run_program(args)


if __name__ == "__main__":
    main()
