"""The `radixgen` command line: flags generated from EngineConfig, and `radixgen run` on a server."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import fields

import pytest

from radixgen.runtime.cli import build_parser
from radixgen.runtime.config import EngineConfig
from radixgen.runtime.config_flags import engine_kwargs, field_docs


def _serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_every_engine_field_is_a_flag_with_its_docstring():
    help_text = " ".join(_serve_parser().format_help().split())
    docs = field_docs(EngineConfig)
    for f in fields(EngineConfig):
        assert "--" + f.name.replace("_", "-") in help_text, f.name
        assert docs[f.name] and docs[f.name][:30] in help_text, f.name


def test_flags_parse_into_an_engine_config():
    args = build_parser().parse_args(["serve", "--port", "1234", "--disable-radix-cache", "--max-total-tokens", "4096",
                                      "--schedule-policy", "fcfs", "--dtype", "bfloat16", "--model-path", "m"])
    cfg = EngineConfig(**engine_kwargs(args))
    assert (cfg.disable_radix_cache, cfg.max_total_tokens, cfg.schedule_policy, cfg.dtype, cfg.model) == \
        (True, 4096, "fcfs", "bfloat16", "m")
    assert args.port == 1234 and args.host == "127.0.0.1"
    defaults = EngineConfig(**engine_kwargs(build_parser().parse_args(["serve"])))
    assert defaults == EngineConfig()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--schedule-policy", "random"])


@pytest.mark.slow
def test_run_a_program_file_against_the_server(server, tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import sys\n"
        "import radixgen as sgl\n\n"
        "@sgl.function\n"
        "def qa(s, q):\n"
        "    s += 'Q: ' + q + '\\nA:'\n"
        "    s += sgl.gen('a', max_tokens=4, temperature=0)\n\n"
        "if __name__ == '__main__':\n"
        "    st = qa.run(q=sys.argv[1])\n"
        "    print('ANSWER', repr(st['a']), st.error())\n")
    out = subprocess.run([sys.executable, "-m", "radixgen.runtime.cli", "run", "--endpoint", server.url, str(prog),
                          "What is 2+2?"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ANSWER '" in out.stdout and out.stdout.strip().endswith("None")
