"""Architectures beyond Llama against HF transformers: Qwen2 (q/k/v bias) and Qwen3 (q/k norms) from
their GGUF conversion (read by HF's own GGUF loader), and Mistral's sliding window from safetensors,
past the window (Gemma 3: test_gemma3.py)."""

from __future__ import annotations

import pytest

from radixgen.runtime.tokenizer import load_tokenizer
from tests.conftest import build_tiny_model
from tests.runtime.hf_to_gguf import convert
from tests.runtime.test_model_logits import PROMPT, check_model


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_gguf_matches_hf(tmp_path, arch):
    # HF's GGUF loader takes Qwen3's head_dim as its default (128), not from the file: build it so
    hf_dir = build_tiny_model(tmp_path / arch, arch, **({"head_dim": 128} if arch == "qwen3" else {}))
    path = convert(hf_dir, tmp_path / f"{arch}.gguf", arch)
    check_model(path, load_tokenizer(hf_dir).encode(PROMPT))


def test_mistral_sliding_window_matches_hf(tmp_path):
    path = build_tiny_model(tmp_path / "mistral", "mistral", sliding_window=16)
    ids = load_tokenizer(path).encode(" ".join([PROMPT] * 3))
    assert len(ids) > 3 * 16
    check_model(path, ids)
