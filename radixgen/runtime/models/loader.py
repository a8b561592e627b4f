"""Weight loading: HF directories (config.json + *.safetensors) and GGUF files.

Both give a `ModelConfig` and a `Checkpoint`: HF-named tensors read lazily, so a tensor-parallel rank
reads only its slices. A GGUF's matrices stay in their quantized blocks: `quantized(name)` reads one
from the file (os.pread of its bytes, so no page of the file stays mapped) into the block kernel's
`BlockWeight`, value for value (`kernels/gguf_blocks.py`), and `stored(name)` an F16 / BF16 one in its
own dtype; `get` dequantizes a tensor to float32 for what runs dense (norms, tensor-parallel shards, a
GPU). Nothing is cached on disk and no float32 copy of the model is made. llama's attn_q / attn_k are
stored permuted for llama.cpp's rotary layout and are un-permuted here (rows of the blocks, too).
A mixture-of-experts layer's stacked expert tensors ([n_expert, rows, cols]) are read one expert at a
time, under HF's per-expert names (`mlp.experts.E.gate_proj.weight`): only that expert's bytes.
Each GGUF architecture's metadata and tensor names: `gguf_arch.py`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from radixgen.runtime.kernels.block_gemm import BlockWeight
from radixgen.runtime.kernels.gguf_blocks import BLOCK_BYTES, DENSE_TYPES, KERNEL_BYTES, dense_from_gguf, from_gguf
from radixgen.runtime.models.config import ModelConfig
from radixgen.runtime.models.gguf_arch import EXTRA_TENSORS, gguf_arch, gguf_config
from radixgen.runtime.models.gguf_file import GGUFHeader, TensorInfo, read_header
from radixgen.runtime.models.resolve import resolve_model_path


class Checkpoint(Protocol):
    """HF-named weights, read by part: a tensor-parallel rank reads only its rows or columns."""

    def get(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        """Tensor `name` (rows `rows`, columns `cols` of a matrix; None: all); KeyError if missing."""

    def quantized(self, name: str, rows: slice | None = None) -> BlockWeight | None:
        """Matrix `name` (its rows `rows`; None: all) in quantized blocks, where the file holds it so
        (None: it does not)."""

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor `name` (outermost first); KeyError if missing."""

    def stored(self, name: str) -> torch.Tensor | None:
        """Matrix `name` in the 16-bit float type the file holds it in (None: another type)."""

    def resident_bytes(self, blocks: bool, dtype: torch.dtype) -> int:
        """About how many bytes the loaded weights take: quantized matrices in the block kernel's formats
        where `blocks`, 16-bit ones as they are, the rest in `dtype` (float32 beside blocks)."""


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

    def quantized(self, name: str, rows: slice | None = None) -> BlockWeight | None:
        return None

    def shape(self, name: str) -> tuple[int, ...]:
        handle = self._where.get(name)
        if handle is None:
            raise KeyError(f"weight {name!r} missing from the checkpoint")
        return tuple(handle.get_slice(name).get_shape())

    def stored(self, name: str) -> torch.Tensor | None:
        return None

    def resident_bytes(self, blocks: bool, dtype: torch.dtype) -> int:
        sizes = (np.prod(handle.get_slice(name).get_shape()) for name, handle in self._where.items())
        return int(sum(sizes)) * dtype.itemsize


def open_checkpoint(model: str | os.PathLike | None) -> tuple[ModelConfig, Checkpoint]:
    """Resolve `model` and return its config and its HF-named weights (read lazily)."""
    path = resolve_model_path(model)
    if path.is_dir():
        config = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {str(path)!r}")
        return config, SafetensorsCheckpoint(files)
    reader = gguf_reader(path)
    extra = {t.name: _read_floats(path, t) for t in reader.tensors if t.name in EXTRA_TENSORS}
    config = gguf_config(reader, extra)
    return config, GGUFCheckpoint(path, reader, config)


def _read_floats(path: Path, t: TensorInfo) -> tuple[float, ...]:
    """A small F32 tensor's values (rotary factors)."""
    if t.qtype != "F32":
        raise ValueError(f"{path.name}: tensor {t.name!r} is {t.qtype}, expected F32")
    with open(path, "rb") as f:
        f.seek(t.offset)
        return tuple(np.frombuffer(f.read(t.n_bytes), dtype=np.float32).tolist())


def gguf_reader(path: Path) -> GGUFHeader:
    """`path`'s GGUF header, parsed once per process while the file is unchanged."""
    stat = path.stat()
    return _parse_gguf(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _parse_gguf(path: str, size: int, mtime_ns: int) -> GGUFHeader:  # size and mtime key the cache
    return read_header(Path(path))


_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(\w+\.weight)")  # HF's name of one expert's matrix


def _unpermute_rows(out_dim: int, n_head: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's per-head rotary permutation of a q/k weight [n_head * head_dim,
    in] (reshape [n_head, head_dim/2, 2, in], swap axes 1 and 2): new row r is old row index[r]."""
    return torch.arange(out_dim).reshape(n_head, out_dim // n_head // 2, 2).transpose(1, 2).reshape(-1)


class GGUFCheckpoint:
    """A GGUF file's tensors under HF names, each read from the file when asked for (os.pread: the
    bytes are the caller's until it drops them; the file's pages are not mapped into the process)."""

    def __init__(self, path: Path, reader: GGUFHeader, config: ModelConfig) -> None:
        self.path = path
        arch = gguf_arch(reader)
        self._tensors = {arch.hf_name(t.name): t for t in reader.tensors if t.name not in EXTRA_TENSORS}
        self._heads = ({"self_attn.q_proj.weight": config.num_heads, "self_attn.k_proj.weight": config.num_kv_heads}
                       if arch.permuted_qk else {})
        for t in reader.tensors:
            qtype = t.qtype
            if qtype not in BLOCK_BYTES and qtype not in DENSE_TYPES:
                raise ValueError(f"unsupported GGUF type {qtype} in tensor {t.name!r} of {path.name} (supported: "
                                 f"{', '.join([*BLOCK_BYTES, *sorted(DENSE_TYPES)])})")

    def resident_bytes(self, blocks: bool, dtype: torch.dtype) -> int:
        total = 0
        for t in self._tensors.values():
            n, qtype, matrix = t.n_elements, t.qtype, len(t.shape) >= 2  # stacked experts: matrices too
            if blocks and matrix and qtype in KERNEL_BYTES:
                total += int(n // 32 * KERNEL_BYTES[qtype])
            elif blocks and matrix and qtype in ("F16", "BF16"):
                total += 2 * n
            else:
                total += n * (4 if blocks else dtype.itemsize)
        return total

    def _tensor(self, name: str) -> TensorInfo:
        t = self._tensors.get(name)
        if t is None:
            raise KeyError(f"weight {name!r} missing from {self.path.name}")
        return t

    def _part(self, name: str) -> tuple[TensorInfo, tuple[int, ...], int, int]:
        """The file tensor holding `name`, `name`'s shape (outermost first), byte offset and size: the
        whole tensor, or one expert's [rows, cols] of a stacked [n_expert, rows, cols] one."""
        m = _EXPERT.fullmatch(name)
        if m is None or name in self._tensors:
            t = self._tensor(name)
            return t, t.shape, t.offset, t.n_bytes
        t, expert = self._tensor(f"{m[1]}.{m[3]}"), int(m[2])
        if len(t.shape) != 3 or expert >= t.shape[0]:
            raise KeyError(f"weight {name!r} missing from {self.path.name} (tensor {t.name!r} is {t.shape})")
        size = t.n_bytes // t.shape[0]
        return t, t.shape[1:], t.offset + expert * size, size

    def _raw(self, name: str, rows: slice | None = None) -> tuple[np.ndarray, str, tuple[int, ...]]:
        """The tensor's bytes as uint8 [rows, bytes per row] (only `rows` of them where given: a 2-D
        tensor's row range, read alone), its GGUF type and its shape (outermost first)."""
        t, shape, offset, size = self._part(name)
        n = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        start, stop, _ = (rows or slice(None)).indices(n)
        row_bytes = size // n
        data = np.empty((max(stop - start, 0), row_bytes), dtype=np.uint8)
        with open(self.path, "rb") as f:
            f.seek(offset + start * row_bytes)
            if f.readinto(memoryview(data).cast("B")) != data.size:
                raise ValueError(f"{self.path.name} ends inside tensor {t.name!r}: the file is truncated")
        return data, t.qtype, shape

    def _rope_rows(self, name: str, n: int) -> torch.Tensor | None:
        """The un-permuting row order for a q/k weight of n rows (None for any other tensor)."""
        heads = next((h for suffix, h in self._heads.items() if name.endswith(suffix)), None)
        return None if heads is None else _unpermute_rows(n, heads)

    def quantized(self, name: str, rows: slice | None = None) -> BlockWeight | None:
        """The matrix `name` in its blocks (rows `rows` of it where given), or None where the file does not
        hold it quantized (or `rows` is given for a q/k weight, whose rows llama.cpp permuted)."""
        t, shape, _, _ = self._part(name)
        if t.qtype not in BLOCK_BYTES or len(shape) != 2:
            return None
        order = self._rope_rows(name, shape[0])
        if rows is not None and order is not None:
            return None
        raw, qtype, shape = self._raw(name, rows)
        w = from_gguf(raw, qtype)
        return w if order is None else w.rows(order)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._part(name)[1])

    def stored(self, name: str) -> torch.Tensor | None:
        t, shape, _, _ = self._part(name)
        if t.qtype not in ("F16", "BF16") or len(shape) != 2:
            return None
        raw, qtype, shape = self._raw(name)
        w = dense_from_gguf(raw.reshape(-1).view(np.float16 if qtype == "F16" else np.uint16), qtype, shape)
        order = self._rope_rows(name, shape[0])
        return w.clone() if order is None else w.index_select(0, order)

    def get(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        raw, qtype, shape = self._raw(name)
        if qtype in BLOCK_BYTES:
            w = from_gguf(raw, qtype).dequantize().reshape(shape)
        else:
            flat = raw.reshape(-1).view({"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[qtype])
            w = dense_from_gguf(flat, qtype, shape).float()
        order = self._rope_rows(name, shape[0])
        if order is not None:
            w = w.index_select(0, order)
        if rows is not None:
            w = w[rows]
        if cols is not None:
            w = w[:, cols]
        return w.contiguous()
