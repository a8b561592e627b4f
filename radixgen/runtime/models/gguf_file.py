"""A GGUF file's header: its metadata and where each tensor's bytes lie (GGUF v2/v3, little-endian).

`gguf.GGUFReader` maps the whole file and builds a numpy view per metadata item (a 49k-token
vocabulary is ~150k of them: ~2.3 s and ~160 MB of Python objects kept as long as the reader
lives). The loader needs scalars, a few arrays' lengths and the tensor table, so this parser walks
the header once with `struct`, keeps scalars and numeric arrays, and only counts string arrays
(the tokenizer is converted from the file by transformers, once, and cached). Layout per the GGUF
spec: magic, version, tensor count, metadata count, metadata (key, type, value), tensor infos
(name, dims innermost first, type, offset), then the data, aligned to `general.alignment`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

# value type -> struct format of one scalar (8: string, 9: array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class StringArray:
    """A metadata array of strings, counted but not read."""

    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: `shape` outermost first (GGUF lists it innermost first)."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    offset: int  # absolute, in the file
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    fields: dict[str, object]
    tensors: list[TensorInfo]

    def get(self, key: str, default: object = None) -> object:
        return self.fields.get(key, default)


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str) -> object:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error as e:
            raise ValueError(f"{self.path.name} is not a complete GGUF file (header ends early)") from e
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path.name} is not a complete GGUF file (a string runs past its end)")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            self.pos += 8 + struct.unpack_from("<Q", self.buf, self.pos)[0]

    def value(self, vtype: int) -> object:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item == STRING:
                self.skip_strings(count)
                return StringArray(count)
            if item not in _SCALARS:
                raise ValueError(f"{self.path.name}: unsupported GGUF array item type {item}")
            fmt = _SCALARS[item]
            size = struct.calcsize(fmt)
            values = list(struct.unpack_from(f"<{count}{fmt[1]}", self.buf, self.pos))
            self.pos += size * count
            return values
        raise ValueError(f"{self.path.name}: unknown GGUF metadata type {vtype}")


def read_header(path: Path) -> GGUFHeader:
    """Parse `path`'s GGUF header (ValueError, naming the file, for anything else)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        size = len(buf)
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path.name} is not a GGUF file (it does not start with 'GGUF')")
        c = _Cursor(buf, path)
        c.pos = 4
        version = c.unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"{path.name}: GGUF version {version} (radixgen reads versions 2 and 3)")
        n_tensors, n_fields = c.unpack("<Q"), c.unpack("<Q")
        fields = {}
        for _ in range(n_fields):
            key = c.string()
            fields[key] = c.value(c.unpack("<I"))
        raw = []
        for _ in range(n_tensors):
            name = c.string()
            dims = [c.unpack("<Q") for _ in range(c.unpack("<I"))]
            raw.append((name, c.unpack("<I"), tuple(reversed(dims)), c.unpack("<Q")))
        align = int(fields.get("general.alignment", 32))
        data = (c.pos + align - 1) // align * align
    tensors = []
    for name, type_id, shape, offset in raw:
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise ValueError(f"{path.name}: tensor {name!r} has unknown GGML type {type_id}") from None
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        n = 1
        for d in shape:
            n *= d
        info = TensorInfo(name, qtype.name, shape, data + offset, n // block * block_bytes)
        if info.offset + info.n_bytes > size:
            raise ValueError(f"{path.name} ends inside tensor {name!r}: the file is truncated")
        tensors.append(info)
    return GGUFHeader(path, fields, tensors)
