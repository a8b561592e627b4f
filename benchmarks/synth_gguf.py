"""Write a synthetic Llama-architecture GGUF of a real model's size, with random weights.

Why: the default model (SmolLM2-135M) fits in the CPU cache, so its speed and memory figures say little
about 1B-8B models, whose decode steps are bound by memory bandwidth. This script writes a file with the
shapes of Llama-3.2-1B, Llama-3.2-3B or Llama-3.1-8B (untied output matrix, grouped-query attention) and
SmolLM2's tokenizer (vocabulary 49152, copied with its chat template from the default model's GGUF), so
the loader, the kernels and the engine run on it unchanged; the text it generates is noise.

Quant mixes (`--quant`):
  Q4_0    layer matrices Q4_0, token_embd and output Q8_0 (llama-quantize would use Q6_K for output).
  Q8_0    every matrix Q8_0.
  Q4_K_M  approximately llama-quantize's Q4_K_M: Q4_K everywhere (token_embd included) except output,
          and attn_v and ffn_down of half of the layers (llama.cpp's `use_more_bits` rule: the first and
          last eighth of the layers and every third one between), which are Q6_K.
Norms are F32 ones. The quantized blocks are random bytes with their scales chosen so that every
dequantized matrix has mean 0 and std about 0.02 (a random 2048-wide layer then keeps activations at
a sane scale). Tensors are generated and written one at a time (numpy, vectorized), so memory stays at
about one tensor (peak RSS ~0.2 GB for 1B, ~0.3 GB for 8B) and a 1B file takes ~4-6 s on 2 cores, most of
it the fixed ~3 s of parsing the source vocabulary; an 8B file should take seconds plus the disk.

  python benchmarks/synth_gguf.py --size 1b --quant Q4_K_M --out /tmp/synth-1b-q4_k_m.gguf [--check]
  python benchmarks/synth_gguf.py --size 8b --quant Q4_0 --layers 1 --out /tmp/t.gguf --check  # quick test

Prints one JSON line: path, size_bytes, params, quant, seconds (and the --check summary). Importable:
`write_synth_gguf(out, size, quant, layers=None)` and `check_gguf(path)`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SIZES: dict[str, ModelShape] = {
    "1b": ModelShape(hidden=2048, inter=8192, layers=16, heads=32, kv_heads=8),  # Llama-3.2-1B
    "3b": ModelShape(hidden=3072, inter=8192, layers=28, heads=24, kv_heads=8),  # Llama-3.2-3B
    "8b": ModelShape(hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8),  # Llama-3.1-8B
}
QUANTS = ("Q4_0", "Q8_0", "Q4_K_M")
TARGET_STD = 0.02
CONTEXT_LENGTH = 8192
ROPE_FREQ_BASE = 500000.0
RMS_EPS = 1e-5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), required=True)
    p.add_argument("--quant", choices=QUANTS, required=True)
    p.add_argument("--out", type=Path, required=True, help="the .gguf to write (overwritten)")
    p.add_argument("--layers", type=int, default=None, help="override the layer count (quick tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-from", type=Path, default=None, help="GGUF to copy tokenizer.* from (default model)")
    p.add_argument("--check", action="store_true", help="read the file back: every tensor dequantizes to finite values")
    return p


if __name__ == "__main__":
    ARGS = build_parser().parse_args()  # --help and bad flags answer before numpy and gguf are imported

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

FILE_TYPES = {
    "Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q8_0": LlamaFileType.MOSTLY_Q8_0, "Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M,
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order (rows, cols): GGUF lists it innermost-first, the writer reverses it
    qtype: QT

    @property
    def n_params(self) -> int:
        return int(np.prod(self.shape))

    @property
    def byte_shape(self) -> tuple[int, ...]:
        block, type_size = GGML_QUANT_SIZES[self.qtype]
        return (*self.shape[:-1], self.shape[-1] // block * type_size)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.byte_shape))


# ---- the tensor plan ---------------------------------------------------------------------------------


def _use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's rule for the layers whose attn_v / ffn_down get Q6_K in Q4_K_M."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _matrix_type(quant: str, kind: str, layer: int, n_layers: int) -> QT:
    """The GGML type of one matrix (`kind`: token_embd, output or a per-layer name like ffn_down)."""
    if quant == "Q8_0":
        return QT.Q8_0
    if quant == "Q4_0":
        return QT.Q8_0 if kind in ("token_embd", "output") else QT.Q4_0
    if kind == "output" or (kind in ("attn_v", "ffn_down") and _use_more_bits(layer, n_layers)):
        return QT.Q6_K
    return QT.Q4_K


def tensor_plan(shape: ModelShape, quant: str, vocab: int) -> list[TensorSpec]:
    """Every tensor of the file, in the order llama.cpp's converter writes them."""
    h, q_dim, kv_dim = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    plan = [TensorSpec("token_embd.weight", (vocab, h), _matrix_type(quant, "token_embd", 0, shape.layers))]
    matrices = {  # (rows = outputs, cols = inputs)
        "attn_q": (q_dim, h), "attn_k": (kv_dim, h), "attn_v": (kv_dim, h), "attn_output": (h, q_dim),
        "ffn_gate": (shape.inter, h), "ffn_up": (shape.inter, h), "ffn_down": (h, shape.inter),
    }
    for i in range(shape.layers):
        plan.append(TensorSpec(f"blk.{i}.attn_norm.weight", (h,), QT.F32))
        for kind, rows_cols in matrices.items():
            plan.append(TensorSpec(f"blk.{i}.{kind}.weight", rows_cols, _matrix_type(quant, kind, i, shape.layers)))
        plan.append(TensorSpec(f"blk.{i}.ffn_norm.weight", (h,), QT.F32))
    plan.append(TensorSpec("output_norm.weight", (h,), QT.F32))
    plan.append(TensorSpec("output.weight", (vocab, h), _matrix_type(quant, "output", 0, shape.layers)))
    return plan


# ---- random blocks, by type ----------------------------------------------------------------------------
# Each returns (n_blocks, type_size) uint8: random payload bytes, then the scale fields overwritten so the
# dequantized values have mean 0 and std TARGET_STD (the random payload's own statistics are exact).


def _random_bytes(rng: np.random.Generator, n_blocks: int, type_size: int) -> np.ndarray:
    n = n_blocks * type_size
    return rng.bit_generator.random_raw((n + 7) // 8).view(np.uint8)[:n].reshape(n_blocks, type_size)


def _f16_bytes(x: float) -> tuple[int, int]:
    lo, hi = np.float16(x).tobytes()
    return lo, hi


def _set_f16(blocks: np.ndarray, at: int, value: float, random_sign: bool) -> None:
    """Write fp16 `value` at byte `at` of every block; random_sign keeps the payload's random top bit as sign."""
    lo, hi = _f16_bytes(value)
    blocks[:, at] = lo
    if random_sign:
        blocks[:, at + 1] &= 0x80
        blocks[:, at + 1] |= hi
    else:
        blocks[:, at + 1] = hi


def _q4_0(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """fp16 d, 16 bytes of nibbles: y = d * (q - 8); E[(q-8)^2] = 21.5, d of random sign."""
    b = _random_bytes(rng, n_blocks, 18)
    _set_f16(b, 0, TARGET_STD / np.sqrt(21.5), random_sign=True)
    return b


def _q8_0(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """fp16 d, 32 int8: y = d * q; E[q^2] = 5461.5, d of random sign."""
    b = _random_bytes(rng, n_blocks, 34)
    _set_f16(b, 0, TARGET_STD / np.sqrt(5461.5), random_sign=True)
    return b


def _q4_k(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles: y = d*sc*q - dmin*m per 32.

    sc is random in 32..63 and m = sc with dmin = 7.5 d, so y = d*sc*(q - 7.5): mean 0 in every sub-block."""
    b = _random_bytes(rng, n_blocks, 144)
    d = float(np.float16(TARGET_STD / np.sqrt(21.25 * np.mean(np.arange(32, 64) ** 2.0))))
    _set_f16(b, 0, d, random_sign=False)
    _set_f16(b, 2, 7.5 * d, random_sign=False)
    sc = 32 | (b[:, 4:12] & 31)  # 8 sub-block scales, from the random bytes already there
    m = sc
    b[:, 4:8] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)  # ggml's get_scale_min_k4 packing
    b[:, 8:12] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    b[:, 12:16] = (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)
    return b


def _q6_k(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """128 bytes ql, 64 bytes qh, 16 int8 scales, fp16 d (last): y = d * sc * (q - 32) per 16.

    |sc| is random in 8..23 with a random sign (mean 0), which keeps d a normal fp16 (not subnormal)."""
    b = _random_bytes(rng, n_blocks, 210)
    raw = b[:, 192:208]
    mag = 8 + (raw & 15)
    b[:, 192:208] = np.where(raw & 0x80, 256 - mag.astype(np.int16), mag).astype(np.uint8)
    _set_f16(b, 208, TARGET_STD / np.sqrt(341.5 * np.mean(np.arange(8, 24) ** 2.0)), random_sign=False)
    return b


BLOCK_WRITERS = {QT.Q4_0: _q4_0, QT.Q8_0: _q8_0, QT.Q4_K: _q4_k, QT.Q6_K: _q6_k}


def tensor_data(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """The tensor's bytes (uint8, byte_shape) or its F32 values (norms: ones)."""
    if spec.qtype == QT.F32:
        return np.ones(spec.shape, np.float32)
    block, _ = GGML_QUANT_SIZES[spec.qtype]
    return BLOCK_WRITERS[spec.qtype](rng, spec.n_params // block).reshape(spec.byte_shape)


# ---- metadata ------------------------------------------------------------------------------------------


def read_tokenizer(source: Path) -> list[tuple[str, object, GGUFValueType, GGUFValueType | None]]:
    """Every tokenizer.* key of `source` (chat template included) as (key, value, type, array item type)."""
    reader = GGUFReader(source)
    keys = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            main = field.types[0]
            keys.append((key, field.contents(), main, field.types[-1] if main == GGUFValueType.ARRAY else None))
    return keys


def add_llama_keys(writer: GGUFWriter, size: str, shape: ModelShape, quant: str, vocab: int) -> None:
    """The keys SmolLM2's GGUF has (general.*, llama.*), with this model's values."""
    writer.add_type("model")
    writer.add_name(f"radixgen synthetic llama {size} {quant}")
    writer.add_size_label(size.upper())
    writer.add_description("Random weights with Llama shapes and the SmolLM2 tokenizer, for benchmarks only.")
    writer.add_block_count(shape.layers)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.inter)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_file_type(int(FILE_TYPES[quant]))
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(shape.head_dim)


def _default_tokenizer_source() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from radixgen.runtime.models.resolve import default_model_path

    return default_model_path()


# ---- write and check -----------------------------------------------------------------------------------


def write_synth_gguf(
    out: Path | str, size: str, quant: str, layers: int | None = None, seed: int = 0, tokenizer_from: Path | None = None
) -> dict[str, object]:
    """Write the file, streaming: header, metadata and tensor infos first, then each tensor's data as it is
    generated (GGUFWriter.add_tensor would keep every array in memory until write_tensors_to_file)."""
    if quant not in QUANTS or size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)} and quant one of {QUANTS}, not {size!r}, {quant!r}")
    shape = SIZES[size]
    if layers is not None:
        shape = ModelShape(shape.hidden, shape.inter, layers, shape.heads, shape.kv_heads)
    t0 = time.perf_counter()
    out = Path(out)
    writer = GGUFWriter(out, "llama")
    tokenizer = read_tokenizer(tokenizer_from or _default_tokenizer_source())
    vocab = len(next(value for key, value, _, _ in tokenizer if key == "tokenizer.ggml.tokens"))
    add_llama_keys(writer, size, shape, quant, vocab)
    for key, value, vtype, sub_type in tokenizer:  # with their exact types (ids UINT32, flags BOOL)
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    writer.add_quantization_version(2)
    plan = tensor_plan(shape, quant, vocab)
    for spec in plan:
        dtype = np.dtype(np.float32) if spec.qtype == QT.F32 else np.dtype(np.uint8)
        raw_dtype = None if spec.qtype == QT.F32 else spec.qtype
        shape_arg = spec.shape if spec.qtype == QT.F32 else spec.byte_shape  # uint8 byte shapes get converted
        writer.add_tensor_info(spec.name, shape_arg, dtype, spec.nbytes, raw_dtype=raw_dtype)
    rng = np.random.default_rng(seed)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for spec in plan:
            writer.write_tensor_data(tensor_data(spec, rng))  # pops the infos in order: same order as the plan
    finally:
        writer.close()
    return {
        "path": str(out), "size_bytes": out.stat().st_size, "params": sum(s.n_params for s in plan),
        "quant": quant, "size": size, "layers": shape.layers, "vocab": vocab,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _sample_rows(n_rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    return np.unique(np.concatenate([[0, n_rows - 1], rng.integers(0, n_rows, k)]))


def check_gguf(path: Path | str, rows: int = 6, seed: int = 0) -> dict[str, object]:
    """Read the file back: norms are all 1.0; every matrix dequantizes (first, last and `rows` random rows)
    to finite values with mean ~0 and std within 25% of TARGET_STD. Raises ValueError otherwise."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    reader = GGUFReader(path)
    stds: list[float] = []
    for t in reader.tensors:
        if t.tensor_type == QT.F32:
            if not np.all(np.asarray(t.data) == 1.0):
                raise ValueError(f"{t.name}: a norm that is not all ones")
            continue
        data = t.data.reshape(-1, t.data.shape[-1])
        vals = dequantize(np.asarray(data[_sample_rows(data.shape[0], rows, rng)]), t.tensor_type)
        std, mean = float(vals.std()), float(vals.mean())
        if not np.isfinite(vals).all() or abs(std / TARGET_STD - 1) > 0.25 or abs(mean) > 0.1 * TARGET_STD:
            raise ValueError(f"{t.name} ({t.tensor_type.name}): std {std:.4g}, mean {mean:.3g}, finite "
                             f"{bool(np.isfinite(vals).all())}")
        stds.append(std)
    return {
        "tensors": len(reader.tensors), "matrices": len(stds), "std_min": round(min(stds), 5),
        "std_max": round(max(stds), 5), "check_seconds": round(time.perf_counter() - t0, 2),
    }


def main(args: argparse.Namespace) -> None:
    result = write_synth_gguf(args.out, args.size, args.quant, args.layers, args.seed, args.tokenizer_from)
    if args.check:
        result["check"] = check_gguf(args.out)
    print(json.dumps(result))


if __name__ == "__main__":
    main(ARGS)
