"""examples/openai_client.py against the session's real server."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("openai")


def test_openai_client_example(server):
    path = Path(__file__).resolve().parents[2] / "examples" / "openai_client.py"
    spec = importlib.util.spec_from_file_location("example_openai_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.main(server.url, max_tokens=16)
    assert set(out["json"]) >= {"city", "population_millions"}
    assert out["tool_call"][0] == "get_weather" and "city" in out["tool_call"][1]
    assert out["stream"]
