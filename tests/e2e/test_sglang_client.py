"""SGLang's own frontend package drives `radixgen serve` unchanged (the native protocol, native.py).

A temporary venv gets `sglang` (no deps) plus the few pure-Python modules its `lang` package imports,
and no torch; sglang_client_programs.py runs there against the session's real server (SmolLM2), and
this file checks its results against the server's own /generate and against the programs' texts.

SGLANG_VERSION is the newest release whose `import sglang` does not import torch (from 0.5.11 on,
`sglang/__init__.py` imports `sglang.srt.utils`, which does); its client code
(`sglang/lang/backend/runtime_endpoint.py`) sends the same requests as 0.5.23's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SGLANG_VERSION = "0.5.10.post1"
# What `import sglang` (0.5.10) needs: sglang/utils.py, lang/choices.py, lang/backend/runtime_endpoint.py.
CLIENT_DEPS = ["numpy", "pybase64", "requests", "ipython", "pydantic", "tqdm", "aiohttp"]
PROGRAMS = Path(__file__).with_name("sglang_client_programs.py")
FEW_SHOT = ("Q: What is the capital of Italy?\nA: Rome\n"
            "Q: What is the capital of Spain?\nA: Madrid\n"
            "Q: What is the capital of Germany?\nA: Berlin\n")


def _pip(python: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check",
           *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"


@pytest.fixture(scope="module")
def sglang_python(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("sglang-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    _pip(python, "--no-deps", f"sglang=={SGLANG_VERSION}")
    _pip(python, *CLIENT_DEPS)
    return python


@pytest.fixture(scope="module")
def results(sglang_python, server) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run([str(sglang_python), str(PROGRAMS), server.url], capture_output=True, text=True,
                         timeout=300, env=env, cwd=sglang_python.parent)
    assert out.returncode == 0, f"SGLang's client failed:\n{out.stderr[-4000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def _generate(server, text: str, **sampling) -> dict:
    status, out = server.post("/generate", {"text": text, "sampling_params": {"temperature": 0, **sampling}})
    assert status == 200, out
    return out


def test_the_client_runs_without_torch_or_radixgen(results):
    assert results["torch_importable"] is False and results["radixgen_importable"] is False
    assert results["model_name"].endswith(".gguf")  # /get_model_info's model_path: the served file
    assert {"version", "internal_states", "max_total_num_tokens"} <= set(results["server_info_keys"])
    assert results["flushed"] is True
    for key, value in results.items():
        if isinstance(value, dict) and "error" in value:
            assert value["error"] is None, (key, value["error"])


def test_gen_with_stop(results, server):
    st = results["qa"]
    prompt = FEW_SHOT + "Q: What is the capital of France?\nA:"
    assert st["text"] == prompt + st["vars"]["answer"]
    assert st["vars"]["answer"] == _generate(server, prompt, max_new_tokens=8, stop="\n")["text"] == " Paris"


def test_select(results):
    st = results["select"]
    assert st["vars"]["city"] == " Paris" and st["text"] == "The capital city of France is Paris"
    meta = st["meta"]["city"]
    scores = meta["normalized_prompt_logprobs"]
    assert len(scores) == 4 and scores.index(max(scores)) == 0
    # each prompt logprob entry carries its token's text (SGLang's client reads it): they spell the choice
    for choice, entries in zip([" Paris", " London", " Berlin", " Madrid"], meta["input_token_logprobs"], strict=True):
        assert "".join(e[2] for e in entries).endswith(choice)


def test_regex_and_gen_int(results):
    st = results["regex"]
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", st["vars"]["phone"])
    assert re.fullmatch(r"[-+]?[0-9]+[ \n]*", st["vars"]["days"])  # SGLang's own REGEX_INT, sent by its client


def test_stop_regex_cuts_after_the_first_match(results):
    st = results["stop_regex"]
    tail = st["vars"]["tail"]
    assert re.search(r"[0-9]", tail) and not re.search(r"[0-9]", tail[:-1]) and tail[-1].isdigit()
    assert st["meta"]["tail"]["finish_reason"] == {"type": "stop", "matched": "[0-9]"}


def test_logprobs_with_token_text(results, server):
    meta = results["logprobs"]["meta"]["lp"]
    out = meta["output_token_logprobs"]
    assert "".join(e[2] for e in out) == results["logprobs"]["vars"]["lp"] and len(out) == 3
    top = meta["output_top_logprobs"]
    assert all(len(row) == 2 and row[0][:2] == e[:2] for row, e in zip(top, out, strict=True))  # greedy: top-1


def test_fork_gather_variable(results, server):
    st = results["fork_gather"]
    fruits = st["vars"]["fruit"]
    assert len(fruits) == 3
    for i, fruit in enumerate(fruits):
        assert fruit == _generate(server, f"Three fruits, one per line.\nFruit {i + 1}:", max_new_tokens=5,
                                  stop="\n")["text"]


def test_fork_concate_and_append(results, server):
    st = results["fork_concat"]
    joined = ("Facts to remember.\nFact 0: Ethan is the father of Liam.\nFact 1: Noah is the father of Julian.\n"
              "Fact 2: Oliver is the father of Carlos.\nQuestion: Who is the father of Julian?\nAnswer:")
    assert st["text"] == joined + st["vars"]["answer"]
    assert st["vars"]["answer"] == _generate(server, joined, max_new_tokens=6, stop="\n")["text"]


def test_streaming(results):
    story = results["story"]["vars"]["story"]
    assert len(results["stream_var_chunks"]) > 5 and "".join(results["stream_var_chunks"]) == story
    assert "".join(results["stream_text_chunks"]) == results["stream_text"] == results["story"]["text"]


def test_run_batch_keeps_order(results, server):
    for st, q in zip(results["batch"], results["batch_questions"], strict=True):
        prompt = FEW_SHOT + "Q: " + q + "\nA:"
        assert st["text"] == prompt + st["vars"]["answer"]
        assert st["vars"]["answer"] == _generate(server, prompt, max_new_tokens=8, stop="\n")["text"]


def test_roles(results, server):
    st = results["chat"]
    answer = st["vars"]["answer"]
    prompt = ("<|im_start|>system\nYou are a terse assistant.<|im_end|>\n<|im_start|>user\nName one colour.<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert st["text"] == prompt + answer + "<|im_end|>\n"
    assert [m["role"] for m in st["messages"]] == ["system", "user", "assistant"]
    assert answer == _generate(server, prompt, max_new_tokens=12, stop=["<|im_end|>"])["text"]
