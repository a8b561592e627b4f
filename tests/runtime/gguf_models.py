"""Tiny Llama GGUF files of random weights in any GGUF type, written with `gguf`'s own writer, for tests
that load the same file in radixgen and in HF transformers (which dequantizes it with gguf-py).

`write_tiny_gemma3_gguf` writes a Gemma 3 one the same way.

Each matrix's blocks are random bytes whose fp16 scale fields are drawn per type so the weights come
out around +-0.1 (random scale bytes would make K-quant weights in the thousands); F32/F16/BF16
matrices are normal(0, 0.05). The vocabulary is VOCAB made-up byte tokens (no tokenizer is needed
to compare logits on token ids).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from radixgen.runtime.kernels.gguf_blocks import BLOCK_BYTES, BLOCK_WEIGHTS
from tests.runtime.test_block_gemm import F16_FIELDS

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 384
# |fp16 scale| drawn per type so that d * (integer scale) * q stays near 0.1 at most
SCALE = {"Q4_0": 0.012, "Q4_1": 0.012, "Q5_0": 0.006, "Q5_1": 0.006, "Q8_0": 0.0008, "Q2_K": 0.003,
         "Q3_K": 0.0015, "Q4_K": 0.0003, "Q5_K": 0.00015, "Q6_K": 0.00006}
LAYER_MATRICES = {"attn_q": (HEADS * 64, HIDDEN), "attn_k": (KV_HEADS * 64, HIDDEN), "attn_v": (KV_HEADS * 64, HIDDEN),
                  "attn_output": (HIDDEN, HEADS * 64), "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN),
                  "ffn_down": (HIDDEN, INTER)}


def _matrix(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """(data, raw type) of a random [rows, cols] matrix in `qtype` (float arrays for the float types)."""
    if qtype in ("F32", "F16"):
        return (rng.normal(0, 0.05, (rows, cols))).astype(np.float32 if qtype == "F32" else np.float16), None
    if qtype == "BF16":
        bits = (rng.normal(0, 0.05, (rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits.view(np.uint8).reshape(rows, -1), gguf.GGMLQuantizationType.BF16
    nb = cols // BLOCK_WEIGHTS[qtype]
    raw = rng.integers(0, 256, (rows, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        scale = rng.uniform(-SCALE[qtype], SCALE[qtype], (rows, nb, 1)).astype(np.float16)
        raw[..., at : at + 2] = scale.view(np.uint8)
    return raw.reshape(rows, -1), gguf.GGMLQuantizationType[qtype]


def write_tiny_gguf(path: Path, types: dict[str, str], default: str, seed: int = 0, tied: bool = False) -> Path:
    """A 2-layer Llama GGUF at `path`: each tensor kind (`attn_q`, ..., `token_embd`, `output`) in
    `types.get(kind, default)`; norms F32 around 1."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(VOCAB)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"<{i}>" for i in range(VOCAB)])
    writer.add_token_types([gguf.TokenType.NORMAL] * VOCAB)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def add(name: str, kind: str, rows: int, cols: int) -> None:
        data, raw_type = _matrix(types.get(kind, default), rows, cols, rng)
        writer.add_tensor(name, data, raw_dtype=raw_type)

    add("token_embd.weight", "token_embd", VOCAB, HIDDEN)
    writer.add_tensor("output_norm.weight", rng.uniform(0.8, 1.2, HIDDEN).astype(np.float32))
    if not tied:
        add("output.weight", "output", VOCAB, HIDDEN)
    for i in range(LAYERS):
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", rng.uniform(0.8, 1.2, HIDDEN).astype(np.float32))
        for kind, (rows, cols) in LAYER_MATRICES.items():
            add(f"blk.{i}.{kind}.weight", kind, rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


GEMMA_LAYERS, GEMMA_HEAD_DIM, GEMMA_WINDOW = 6, 256, 16  # llama.cpp's Gemma 3: every sixth layer is global
GEMMA_MATRICES = {"attn_q": (2 * GEMMA_HEAD_DIM, HIDDEN), "attn_k": (GEMMA_HEAD_DIM, HIDDEN),
                  "attn_v": (GEMMA_HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, 2 * GEMMA_HEAD_DIM),
                  "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN), "ffn_down": (HIDDEN, INTER)}
GEMMA_NORMS = {"attn_norm": HIDDEN, "post_attention_norm": HIDDEN, "ffn_norm": HIDDEN, "post_ffw_norm": HIDDEN,
               "attn_q_norm": GEMMA_HEAD_DIM, "attn_k_norm": GEMMA_HEAD_DIM}


def write_tiny_gemma3_gguf(path: Path, types: dict[str, str], default: str, seed: int = 0) -> Path:
    """A 6-layer Gemma 3 GGUF at `path` as llama.cpp's converter writes one (norm weights already 1 + w,
    the window in metadata, the layer pattern and local rotary base left to the reader), 2 query heads
    and 1 KV head of 256, a 16-token window, a tied head; tensor kinds in `types.get(kind, default)`."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_block_count(GEMMA_LAYERS)
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_key_length(GEMMA_HEAD_DIM)
    writer.add_value_length(GEMMA_HEAD_DIM)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(GEMMA_WINDOW)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(VOCAB)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"<{i}>" for i in range(VOCAB)])
    writer.add_token_types([gguf.TokenType.NORMAL] * VOCAB)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)

    def add(name: str, kind: str, rows: int, cols: int) -> None:
        data, raw_type = _matrix(types.get(kind, default), rows, cols, rng)
        writer.add_tensor(name, data, raw_dtype=raw_type)

    add("token_embd.weight", "token_embd", VOCAB, HIDDEN)
    writer.add_tensor("output_norm.weight", rng.uniform(0.8, 1.2, HIDDEN).astype(np.float32))
    for i in range(GEMMA_LAYERS):
        for norm, size in GEMMA_NORMS.items():
            writer.add_tensor(f"blk.{i}.{norm}.weight", rng.uniform(0.8, 1.2, size).astype(np.float32))
        for kind, (rows, cols) in GEMMA_MATRICES.items():
            add(f"blk.{i}.{kind}.weight", kind, rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
