"""Weight loading: HF directories (config.json + *.safetensors) and GGUF files.

Both give a `ModelConfig` and a `Checkpoint` of HF-named float tensors read lazily from safetensors
files, so a tensor-parallel rank reads only its slices. GGUF tensors are dequantized with the `gguf`
package; llama's attn_q / attn_k are stored permuted for llama.cpp's rotary layout and are un-permuted
here. Dequantized GGUF weights are cached as safetensors in the user cache dir (dequantizing all of
SmolLM2's 272 tensors takes ~5 s; reading the cache well under 1 s), which is what the checkpoint
reads. `load_gguf_blocks` reads the quantized blocks themselves for the block kernels.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from pathlib import Path
from typing import Protocol

import torch

from radixgen.runtime.kernels.block_gemm import GGUF_BLOCK_BYTES, BlockWeight, from_gguf
from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.models.resolve import cache_dir_for, resolve_model_path

logger = logging.getLogger(__name__)
GGUF_QUANTS = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GGUF_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
WEIGHTS_CACHE_NAME = "weights.safetensors"


class Checkpoint(Protocol):
    """HF-named weights, read by part: a tensor-parallel rank reads only its rows or columns."""

    def get(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        """Tensor `name` (rows `rows`, columns `cols` of a matrix; None: all); KeyError if missing."""


class SafetensorsCheckpoint:
    """Tensors in safetensors files, memory-mapped: `get` reads only the slice asked for."""

    def __init__(self, files: list[Path]) -> None:
        from safetensors import safe_open

        self._where = {}
        for f in files:
            handle = safe_open(str(f), framework="pt")
            self._where.update((name, handle) for name in handle.keys())  # noqa: SIM118 (not a dict)

    def get(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        handle = self._where.get(name)
        if handle is None:
            raise KeyError(f"weight {name!r} missing from the checkpoint")
        if rows is None and cols is None:
            return handle.get_tensor(name)
        part = handle.get_slice(name)
        return part[rows or slice(None)] if cols is None else part[rows or slice(None), cols]


def open_checkpoint(model: str | os.PathLike | None) -> tuple[ModelConfig, Checkpoint]:
    """Resolve `model` and return its config and its HF-named float32/bf16 weights (read lazily).
    A GGUF is dequantized once into a safetensors cache (see `gguf_weights_file`)."""
    path = resolve_model_path(model)
    if path.is_dir():
        config = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {str(path)!r}")
        return config, SafetensorsCheckpoint(files)
    config = gguf_config(gguf_reader(path))
    return config, SafetensorsCheckpoint([gguf_weights_file(path, config)])


def gguf_reader(path: Path):
    """A parsed `gguf.GGUFReader` of `path`, shared within the process while the file is unchanged.
    Parsing SmolLM2's metadata (its 49k-token vocabulary) takes ~3 s; the dense and the block weights
    and every later engine of the process reuse one parse."""
    stat = path.stat()
    return _parse_gguf(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _parse_gguf(path: str, size: int, mtime_ns: int):  # size and mtime key the cache
    import gguf

    return gguf.GGUFReader(path)


def _gguf_field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader) -> ModelConfig:
    arch = _gguf_field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r}: radixgen loads GGUF files of 'llama'")
    p = f"{arch}."
    heads = int(_gguf_field(reader, p + "attention.head_count"))
    hidden = int(_gguf_field(reader, p + "embedding_length"))
    names = {t.name for t in reader.tensors}
    eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id")
    n_vocab = _gguf_field(reader, p + "vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return ModelConfig(
        arch="llama",
        vocab_size=int(n_vocab),
        hidden_size=hidden,
        intermediate_size=int(_gguf_field(reader, p + "feed_forward_length")),
        num_layers=int(_gguf_field(reader, p + "block_count")),
        num_heads=heads,
        num_kv_heads=int(_gguf_field(reader, p + "attention.head_count_kv", heads)),
        head_dim=int(_gguf_field(reader, p + "rope.dimension_count", hidden // heads)),
        rms_norm_eps=float(_gguf_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_gguf_field(reader, p + "rope.freq_base", 10000.0)),
        max_position_embeddings=int(_gguf_field(reader, p + "context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
    )


def _unpermute_rope(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's per-head rotary permutation of a q/k weight [n_head * head_dim, in]."""
    out_dim, in_dim = w.shape
    return w.reshape(n_head, out_dim // n_head // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def _unpermute_rows(out_dim: int, n_head: int) -> torch.Tensor:
    """Row order of `_unpermute_rope` as an index: new row r is old row index[r]."""
    return torch.arange(out_dim).reshape(n_head, out_dim // n_head // 2, 2).transpose(1, 2).reshape(-1)


def _hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{GGUF_LAYER_NAMES[parts[2]]}.{suffix}"
    if base in GGUF_TOP_NAMES:
        return f"{GGUF_TOP_NAMES[base]}.{suffix}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def load_gguf_blocks(path: Path, config: ModelConfig) -> dict[str, BlockWeight]:
    """The GGUF's Q4_0/Q4_1/Q8_0 matrices as BlockWeights (HF names, q/k rows un-permuted), read
    without dequantizing; other tensors are left out (they run dense)."""
    reader = gguf_reader(path)
    blocks: dict[str, BlockWeight] = {}
    for t in reader.tensors:
        if t.tensor_type.name not in GGUF_BLOCK_BYTES or len(t.shape) != 2:
            continue
        name = _hf_name(t.name)
        w = from_gguf(t.data, t.tensor_type.name)
        if name.endswith("q_proj.weight"):
            w = w.rows(_unpermute_rows(w.shape[0], config.num_heads))
        elif name.endswith("k_proj.weight"):
            w = w.rows(_unpermute_rows(w.shape[0], config.num_kv_heads))
        blocks[name] = w
    return blocks


def gguf_weights_file(path: Path, config: ModelConfig) -> Path:
    """The GGUF's weights dequantized to float32 HF-named tensors in a safetensors file in the user
    cache dir, written on first use (q/k rows un-permuted)."""
    import gguf
    from safetensors.torch import save_file

    cache = cache_dir_for(path) / WEIGHTS_CACHE_NAME
    if cache.is_file():
        return cache
    reader = gguf_reader(path)
    logger.info("dequantizing %d GGUF tensors of %s (first load of this file; cached in %s)", len(reader.tensors),
                path.name, cache.parent)
    t0 = time.perf_counter()
    weights: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        qtype = t.tensor_type.name
        if qtype not in GGUF_QUANTS:
            raise ValueError(
                f"unsupported GGUF quantization {qtype} in tensor {t.name!r} "
                f"(supported: {', '.join(sorted(GGUF_QUANTS))})"
            )
        name = _hf_name(t.name)
        arr = gguf.quants.dequantize(t.data, t.tensor_type)  # numpy, outermost-first shape
        w = torch.from_numpy(arr.reshape([int(d) for d in reversed(t.shape)]).copy()).float()
        if name.endswith("q_proj.weight"):
            w = _unpermute_rope(w, config.num_heads)
        elif name.endswith("k_proj.weight"):
            w = _unpermute_rope(w, config.num_kv_heads)
        weights[name] = w
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    save_file(weights, str(tmp))
    os.replace(tmp, cache)
    logger.info("dequantized in %.1f s", time.perf_counter() - t0)
    return cache
