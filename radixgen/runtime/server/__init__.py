"""OpenAI-compatible HTTP server over an Engine: `create_app(engine, api_key=None, model_name=None)`.

See app.py for the routes; chat.py and completions.py hold the OpenAI endpoints, protocol.py the
request / response models, state.py what every handler shares (ServerState, engine-call helpers),
streams.py the SSE framing; metrics, logs and traces live in runtime/observability/. Imported
lazily (FastAPI is only needed when serving).
"""

from __future__ import annotations

from typing import Any


def create_app(engine: Any, api_key: str | None = None, model_name: str | None = None,
               tool_call_parser: str | None = None, reasoning_parser: str | None = None) -> Any:
    from radixgen.runtime.server.app import create_app as _create_app

    return _create_app(engine, api_key=api_key, model_name=model_name, tool_call_parser=tool_call_parser,
                       reasoning_parser=reasoning_parser)


__all__ = ["create_app"]
