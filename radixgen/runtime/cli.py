"""The `radixgen` command: `serve` (the HTTP server) and `run` (a Python file with @function programs).

    radixgen serve [--model M] [--host 127.0.0.1] [--port 30000] [--api-key K] [every EngineConfig field]
                   [every ServerOptions field: request limits, --public-metrics]
    radixgen router --worker-urls URL [URL ...] [--host H] [--port P] [every RouterConfig field]
    radixgen run [--endpoint URL] path/to/program.py [program args ...]

`serve --dp-size N` starts N replicas behind a router in this process; `serve --node-rank K` (K > 0)
runs that machine's tensor-parallel ranks for node 0's engine (see docs/scaling.md).

The engine flags are generated from `EngineConfig`'s fields (so a flag and a field never drift): the
name with dashes, the type and choices from the annotation, the help from the docstring under the
field. A bool field defaulting to False is a switch (`--disable-radix-cache`); one defaulting to True
gets a `--no-...` form.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import logging
import os
import runpy
import sys
import textwrap
import typing
from collections.abc import Iterator
from dataclasses import MISSING, fields
from typing import Any

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.router.config import RouterConfig
from radixgen.runtime.server.options import ServerOptions


def field_docs(cls: type) -> dict[str, str]:
    """The docstring literal under each annotated field of a dataclass (PEP 257 attribute docstrings)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(type without None, whether None is allowed)."""
    args = typing.get_args(tp)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else rest), True
    return tp, False


def add_engine_flags(parser: argparse.ArgumentParser, aliases: dict[str, list[str]] | None = None) -> None:
    """One flag per EngineConfig field."""
    add_config_flags(parser, EngineConfig, "engine options (EngineConfig fields)", aliases)


def add_config_flags(parser: argparse.ArgumentParser, cls: type, title: str,
                     aliases: dict[str, list[str]] | None = None) -> None:
    """One flag per field of the config dataclass `cls`, in an argument group titled `title`."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    group = parser.add_argument_group(title)
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        names = [flag, *(aliases or {}).get(f.name, [])]
        default = f.default if f.default is not MISSING else None
        help_ = docs.get(f.name, "")
        tp, optional = _base_type(hints[f.name])
        if tp is bool:
            if default:
                group.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=True, help=help_)
            else:
                group.add_argument(*names, dest=f.name, action="store_true", help=help_)
            continue
        kw: dict[str, Any] = {"dest": f.name, "default": default}
        if typing.get_origin(tp) is typing.Literal:
            kw["choices"] = list(typing.get_args(tp))
            kw["type"] = type(kw["choices"][0])
        elif tp in (int, float, str):
            kw["type"] = tp
        suffix = f" (default: {default})" if default is not None else ""
        group.add_argument(*names, help=help_ + suffix, metavar=f.name.upper() if "choices" not in kw else None,
                           **kw)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return config_kwargs(args, EngineConfig)


def config_kwargs(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in fields(cls)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixgen", description="radixgen: structured generation runtime.")
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
    serve.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                       help="log level of the server (default: warning)")
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
    from radixgen.runtime.server import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    engine = Engine(**engine_kwargs(args))
    try:
        app = create_app(engine, api_key=args.api_key, model_name=args.served_model_name,
                         options=ServerOptions(**config_kwargs(args, ServerOptions)))
        state = app.state.radixgen

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
                                timeout_graceful_shutdown=5, access_log=args.log_level == "debug")
        print(f"radixgen: serving {state.model_name!r} at http://{args.host}:{args.port}", flush=True)
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
