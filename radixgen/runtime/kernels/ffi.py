"""The C kernels' boundary in Python: functions bound from the header, structs mirrored and checked.

`csrc/radixgen_kernels.h` declares every exported function and every struct passed across. This
module parses the prototypes to bind each function's ctypes argument and return types (so no
argument list is written twice), and mirrors the structs as ctypes Structures whose fields are
checked against the header's declarations and whose sizes are checked against sizeof() in the
built library when it is loaded. A drifted declaration is an error at load, not memory corruption.
"""

from __future__ import annotations

import ctypes
import functools
import re

import torch

from radixgen.runtime.kernels.build import CSRC, build

HEADER = CSRC / "radixgen_kernels.h"

_SCALARS = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float}
_RETURNS = {"void": None, **_SCALARS}


class BlockWeightC(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_int64), ("flags", ctypes.c_int64), ("qs", ctypes.c_void_p),
                ("scale", ctypes.c_void_p), ("minv", ctypes.c_void_p), ("sup", ctypes.c_void_p)]


class LayerC(ctypes.Structure):
    _fields_ = [("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("k_buf", ctypes.c_void_p),
                ("v_buf", ctypes.c_void_p), ("qkv", BlockWeightC), ("o", BlockWeightC), ("gate_up", BlockWeightC),
                ("down", BlockWeightC), ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("attn_out_norm", ctypes.c_void_p), ("mlp_out_norm", ctypes.c_void_p), ("gelu", ctypes.c_int64),
                ("local", ctypes.c_int64)]


class DecodeStepC(ctypes.Structure):
    _fields_ = [("tokens", ctypes.c_int64), ("hidden", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("inter", ctypes.c_int64),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("cos_t", ctypes.c_void_p),
                ("sin_t", ctypes.c_void_p), ("positions", ctypes.c_void_p), ("loc", ctypes.c_void_p),
                ("req_to_token", ctypes.c_void_p), ("table_stride", ctypes.c_int64), ("rows", ctypes.c_void_p),
                ("seq_lens", ctypes.c_void_p), ("shared", ctypes.c_void_p), ("n_shared", ctypes.c_int64),
                ("kv_dtype", ctypes.c_int64), ("local_cos_t", ctypes.c_void_p), ("local_sin_t", ctypes.c_void_p),
                ("win_table", ctypes.c_void_p), ("win_stride", ctypes.c_int64), ("win_rows", ctypes.c_void_p),
                ("win_seq_lens", ctypes.c_void_p)]


STRUCTS = {"rg_block_weight": BlockWeightC, "rg_layer": LayerC, "rg_decode_step": DecodeStepC}

# the kernels' kv_dtype arguments; int8 buffers hold rows with scales (radix_cache/kv_quant.py)
KV_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3}


def kv_dtype_code(dtype: torch.dtype) -> int:
    """The kernels' code for a KV cache element type (ValueError for one they do not read)."""
    if dtype not in KV_DTYPE_CODES:
        raise ValueError(f"the C kernels read float32, bfloat16, float16 or int8 K/V, not {dtype}")
    return KV_DTYPE_CODES[dtype]


def _ctype(decl: str) -> object:
    """ctypes type of a C parameter or field declaration (its name stripped by the caller)."""
    if "*" in decl:
        return ctypes.c_void_p
    words = decl.replace("const", "").split()
    if len(words) != 1:
        raise ValueError(f"cannot map the C type {decl!r}")
    return _SCALARS.get(words[0]) or STRUCTS[words[0]]


def _header() -> str:
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # comments
    return re.sub(r"^#.*$", "", text, flags=re.M)  # preprocessor lines


@functools.cache
def prototypes() -> dict[str, tuple[object, list[object]]]:
    """Every function declared in the header: name -> (restype, argtypes)."""
    out = {}
    for ret, name, params in re.findall(r"\b(void|int|int64_t)\s+(\w+)\s*\(([^)]*)\)\s*;", _header()):
        args = [] if params.strip() in ("", "void") else [_ctype(re.sub(r"\w+\s*$", "", p.strip()))
                                                         for p in params.split(",")]
        out[name] = (_RETURNS[ret], args)
    return out


@functools.cache
def header_structs() -> dict[str, list[tuple[str, object]]]:
    """Every struct declared in the header: name -> [(field, ctypes type)]."""
    out = {}
    for body, name in re.findall(r"typedef\s+struct\s*\{([^}]*)\}\s*(\w+)\s*;", _header()):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            field = re.search(r"(\w+)\s*$", decl).group(1)
            fields.append((field, _ctype(decl[: -len(field)])))
        out[name] = fields
    return out


def check_structs(lib: ctypes.CDLL) -> None:
    """Raise unless every ctypes mirror has the header's fields and the library's sizeof."""
    declared = header_structs()
    if set(declared) != set(STRUCTS):
        raise RuntimeError(f"radixgen_kernels.h declares structs {sorted(declared)}, ffi.py mirrors {sorted(STRUCTS)}")
    for name, mirror in STRUCTS.items():
        if [(f, t) for f, t in mirror._fields_] != declared[name]:
            raise RuntimeError(f"ffi.py's {mirror.__name__} does not match struct {name} in radixgen_kernels.h")
        c_size = getattr(lib, "rg_sizeof_" + name.removeprefix("rg_"))()
        if c_size != ctypes.sizeof(mirror):
            raise RuntimeError(f"sizeof({name}) is {c_size} in C but {ctypes.sizeof(mirror)} in ffi.py")


@functools.cache
def load(variant: str = "native") -> ctypes.CDLL | None:
    """The kernel library in `variant` (see `build`), every header function bound, structs checked;
    None when it cannot be built."""
    path = build(variant)
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in prototypes().items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    check_structs(lib)
    return lib


_kernel_threads: int | None = None


def set_kernel_threads(n: int | None) -> None:
    """Fix how many threads the C kernels run on (the engine sets its configured count, so a thread that
    runs its own torch ops serially still runs the kernels in parallel); None: torch's count."""
    global _kernel_threads
    if n is not None and n < 1:
        raise ValueError(f"kernel threads must be >= 1, got {n}")
    _kernel_threads = n


def kernel_threads() -> int:
    """The C kernels' thread count: `set_kernel_threads`'s, else torch's on the calling thread."""
    return _kernel_threads or torch.get_num_threads()


def library() -> ctypes.CDLL | None:
    """The native kernel library (the one the engine runs)."""
    return load("native")


# rg_simd_level bits (simd_math.h)
SIMD_BITS = {1: "avx2", 2: "avx-vnni", 4: "avx512-vnni", 8: "amx", 16: "neon-dotprod"}


def simd_features(lib: ctypes.CDLL | None = None) -> set[str]:
    """The SIMD paths a kernel library runs (empty for the scalar build, or when none could be built)."""
    lib = lib or library()
    level = 0 if lib is None else lib.rg_simd_level()
    return {name for bit, name in SIMD_BITS.items() if level & bit}


def simd_path(lib: ctypes.CDLL | None = None) -> str:
    """Which SIMD paths a kernel library runs ("avx2+avx-vnni+avx512-vnni+amx", "avx2", "scalar"...),
    or "off" when none could be built."""
    lib = lib or library()
    if lib is None:
        return "off"
    return "+".join(name for bit, name in SIMD_BITS.items() if lib.rg_simd_level() & bit) or "scalar"

