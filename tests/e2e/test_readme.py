"""Every README code block runs: the Python blocks are executed (the tour is examples/tour.py, word for
word), the shell blocks' `make` targets, `radixgen` command lines and pip extras exist.

The Python blocks run in this process on the session's engine (`Engine()` returns it, as in
tests/test_examples.py) and, for the blocks that talk to `http://127.0.0.1:30000`, against the
session's server at its own address.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import radixgen
from radixgen.runtime.cli import build_parser

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.S)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
SHELL = [code for lang, code in BLOCKS if lang == "bash"]


@pytest.fixture
def readme_engine(engine, monkeypatch):
    def factory(*args, **kwargs):
        assert not args and not kwargs, "README blocks run on the default model: Engine() without arguments"
        return engine

    monkeypatch.setattr(radixgen, "Engine", factory)
    monkeypatch.setattr(engine, "shutdown", lambda: None)
    yield engine
    radixgen.set_default_backend(None)


def test_the_tour_is_examples_tour_py():
    tour = (ROOT / "examples" / "tour.py").read_text()
    body = tour.split('"""', 2)[2].lstrip("\n")  # the file is the block plus its docstring
    assert PYTHON[0] == body


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_python_block_runs(index, readme_engine, server, capsys):
    code = PYTHON[index].replace("http://127.0.0.1:30000", server.url)
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert out.strip(), "every README block prints what it shows"
    if index == 0:  # the tour: its five prints
        lines = out.strip().splitlines()
        assert " | a " in lines[0] and "cached tokens:" in lines[0]
        assert lines[1].startswith("[") and lines[1].count("'") >= 6  # three facts
        assert "name=" in lines[4] and "is_capital=" in lines[4]


def _commands(block: str) -> list[list[str]]:
    out = []
    for line in block.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line))
    return out


@pytest.mark.parametrize("block", SHELL)
def test_shell_block_commands_exist(block):
    makefile = (ROOT / "Makefile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    extras = re.findall(r"^(\w+) = \[", pyproject.split("[project.optional-dependencies]", 1)[1], flags=re.M)
    for cmd in _commands(block):
        if cmd[0] == "make":
            assert re.search(rf"^{cmd[1]}:", makefile, flags=re.M), cmd
        elif cmd[:3] == ["python", "-m", "radixgen"] or cmd[0] in ("radixgen", ".venv/bin/radixgen"):
            args = cmd[3:] if cmd[0] == "python" else cmd[1:]
            try:
                build_parser().parse_args(args)
            except SystemExit as e:  # --help / --version exit 0
                assert e.code == 0, cmd
        elif cmd[:2] == ["pip", "install"]:
            for arg in cmd[2:]:
                m = re.fullmatch(r"\.\[(\w+)\]", arg)
                assert m is None or m.group(1) in extras, cmd
        else:
            raise AssertionError(f"README shell command not checked by this test: {cmd}")
