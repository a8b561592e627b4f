"""The `radixgen` command: `serve` (the HTTP server) and `run` (a Python file with @function programs).

    radixgen serve [--model M] [--host 127.0.0.1] [--port 30000] [--api-key K] [every EngineConfig field]
    radixgen run [--endpoint URL] path/to/program.py [program args ...]
    radixgen --version                 (also `python -m radixgen ...`)

Start-up problems the user can fix (a model that cannot be found, an unavailable device, a bad
setting) end with one `radixgen serve: error: ...` line and exit status 1, not a traceback.

The engine flags are generated from `EngineConfig`'s fields (so a flag and a field never drift): the
name with dashes, the type and choices from the annotation, the help from the docstring under the
field. A bool field defaulting to False is a switch (`--disable-radix-cache`); one defaulting to True
gets a `--no-...` form.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import logging
import os
import runpy
import sys
import textwrap
import time
import typing
from dataclasses import MISSING, fields
from typing import Any

from radixgen.runtime.config import EngineConfig


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
    hints = typing.get_type_hints(EngineConfig)
    docs = field_docs(EngineConfig)
    group = parser.add_argument_group("engine options (EngineConfig fields)")
    for f in fields(EngineConfig):
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
    return {f.name: getattr(args, f.name) for f in fields(EngineConfig)}


def build_parser() -> argparse.ArgumentParser:
    from radixgen import __version__

    parser = argparse.ArgumentParser(prog="radixgen", description="radixgen: structured generation runtime.")
    parser.add_argument("--version", action="version", version=f"radixgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{serve,run}")
    sub.required = True
    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                           description="Serve a model: /v1/chat/completions, /v1/completions, /v1/models, "
                                       "/generate, /flush_cache, /metrics, /health.")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=30000, help="port to bind (default: 30000)")
    serve.add_argument("--api-key", default=os.environ.get("RADIXGEN_API_KEY"),
                       help="require 'Authorization: Bearer <key>' on every route but /health "
                            "(default: $RADIXGEN_API_KEY, else no key)")
    serve.add_argument("--served-model-name", default=None,
                       help="the model id clients pass as `model` (default: derived from --model)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="log level of the server (default: info: load progress, then warnings)")
    serve.add_argument("--skip-warmup", action="store_true",
                       help="accept requests right after loading, without first running one short request "
                            "(the first request then pays for the warm-up, ~1-8 s)")
    add_engine_flags(serve, aliases={"model": ["--model-path"]})
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

    from radixgen.runtime.engine import Engine
    from radixgen.runtime.server import create_app
    from radixgen.runtime.server.warmup import warm_up

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    t0 = time.perf_counter()
    try:
        engine = Engine(**engine_kwargs(args))
    except (FileNotFoundError, ValueError, TypeError) as e:
        raise SystemExit(f"radixgen serve: error: {e}") from None
    try:
        app = create_app(engine, api_key=args.api_key, model_name=args.served_model_name)
        state = app.state.radixgen
        if not args.skip_warmup:
            warm_up(engine, state)

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                state.draining = True  # new requests get 503 while in-flight ones finish
                super().handle_exit(sig, frame)

        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                timeout_graceful_shutdown=5, access_log=args.log_level == "debug")
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
    else:
        run_program(args)


if __name__ == "__main__":
    main()
