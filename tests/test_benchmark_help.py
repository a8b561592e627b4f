"""Every benchmark answers --help at once: its arguments are parsed before torch is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("bench_*.py"))
PROBE = """
import contextlib, io, runpy, sys
sys.argv = [sys.argv[1], "--help"]
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    assert e.code == 0, e.code
else:
    raise AssertionError("--help did not exit")
assert out.getvalue().startswith("usage:"), out.getvalue()[:200]
assert "torch" not in sys.modules, "torch was imported before the arguments were parsed"
"""


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_help_before_torch(script):
    out = subprocess.run([sys.executable, "-c", PROBE, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
