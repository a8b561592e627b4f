"""GGUF quantized tensors as the block kernel's weights, value for value.

Each GGUF type is read from its raw bytes (numpy, vectorized) into a `BlockWeight`: small integers q
and a float32 scale and min per 32 weights (per 16 for the K-quants with 16-weight sub-blocks), so
that scale * q + min, computed in float32, is exactly what `gguf.quants.dequantize` gives (the layouts
follow ggml's block definitions, which gguf-py's dequantizers spell out):

    type   bytes/256 weights   q                     scale, min (per block or half block)
    Q4_0   144                 nibble 0..15          d, -8 d
    Q4_1   160                 nibble 0..15          d, m
    Q5_0   176                 5 bits 0..31          d, -16 d
    Q5_1   192                 5 bits 0..31          d, m
    Q8_0   272                 int8                  d, none
    Q2_K   84                  2 bits 0..3           d sc, -dmin m      (per 16)
    Q3_K   110                 3 bits + 4: 0..7      d (sc - 32), -4 d (sc - 32)   (per 16)
    Q4_K   144                 nibble 0..15          d sc, -dmin m
    Q5_K   176                 5 bits 0..31          d sc, -dmin m
    Q6_K   210                 6 bits 0..63          d sc, -32 d sc     (per 16)

Every product and sum above is exact in float32 or rounds once exactly as gguf's own expression does
(d is fp16, sc at most 8 bits, q at most 6: at most 24 significant bits). The kernel reads Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q4_K and Q6_K in about the file's bytes (the K-quants' factors kept as `KFactors`,
their 6-bit scales widened to a byte; the 5-bit ones as a 4-bit and a 1-bit plane); the others cost it
more (Q5_K's scales float32, Q2_K's and Q3_K's integers a byte each): see KERNEL_BYTES and
docs/architecture.md.
"""

from __future__ import annotations

import numpy as np
import torch

from radixgen.runtime.kernels.block_gemm import BLOCK, BlockWeight, KFactors

QK_K = 256
# bytes per block (32 weights, or 256 for the K-quants) in the file
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34,
               "Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
BLOCK_WEIGHTS = {name: QK_K if name.endswith("_K") else BLOCK for name in BLOCK_BYTES}
DENSE_TYPES = {"F32", "F16", "BF16"}
# bytes per 32 weights each type takes in the kernel's panels (q, then fp16 or float32 scales and mins)
KERNEL_BYTES = {"Q4_0": 20, "Q4_1": 20, "Q5_0": 24, "Q8_0": 34, "Q5_1": 24, "Q5_K": 28, "Q4_K": 18.5,
                "Q2_K": 48, "Q3_K": 48, "Q6_K": 26.25}


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 from the last axis' 2 bytes, as float32 [...]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles32(b: np.ndarray) -> np.ndarray:
    """GGUF's 16 bytes of a 32-weight block -> q [..., 32] (low nibbles weights 0..15, high 16..31)."""
    return np.concatenate([b & 15, b >> 4], axis=-1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Bit j of a little-endian bit field [..., bytes] as uint8 [..., count]."""
    return np.unpackbits(qh, axis=-1, bitorder="little")[..., :count]


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins [..., 12] (uint8) -> sc, m [..., 8] (uint8)."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _t16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 from the last axis' 2 bytes (uint8 [..., 2]), as float32 [..., 1]."""
    return b.contiguous().view(torch.float16).float()


def _f32(a: np.ndarray, n: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).reshape(n, -1))


def _i16(a: np.ndarray, n: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int16).reshape(n, -1))


def from_gguf(data: np.ndarray, qtype: str) -> BlockWeight:
    """A GGUF tensor's raw bytes (uint8 [n, bytes per row]) of any type in BLOCK_BYTES as a BlockWeight."""
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"no block kernel for GGUF type {qtype} (have {', '.join(BLOCK_BYTES)})")
    n = data.shape[0]
    b = np.ascontiguousarray(data).reshape(n, -1, BLOCK_BYTES[qtype])  # [n, blocks, bytes]
    if qtype in ("Q4_0", "Q4_1", "Q8_0"):
        return _legacy(b, qtype, n)
    if qtype in ("Q5_0", "Q5_1"):
        return _q5(b, qtype, n)
    return _K_READERS[qtype](b, n)


def _legacy(b: np.ndarray, qtype: str, n: int) -> BlockWeight:
    d = _f16(b[..., 0:2])  # [n, nb]
    if qtype == "Q8_0":
        return BlockWeight(8, torch.from_numpy(b[..., 2:].copy().view(np.int8).reshape(n, -1)), _f32(d, n), None)
    qs = torch.from_numpy(b[..., 4 if qtype == "Q4_1" else 2:].copy().reshape(n, -1))
    if qtype == "Q4_1":
        return BlockWeight(4, qs, _f32(d, n), _f32(_f16(b[..., 2:4]), n))
    return BlockWeight(4, qs, _f32(d, n), _f32(-8.0 * d, n))  # Q4_0: d (q - 8) = d q - 8 d, both exact


def _pack5(q: torch.Tensor) -> torch.Tensor:
    """5-bit q [n, nb, 32] (uint8 0..31) -> the 5-bit BlockWeight's bytes [n, nb * 20]: per block 16 bytes
    q_j & 15 | (q_{j+16} & 15) << 4, then 4 bytes whose byte t, bit g is q_{4g+t}'s high bit."""
    n = q.shape[0]
    low = (q[..., :16] & 15) | ((q[..., 16:] & 15) << 4)  # [n, nb, 16]
    hi = (q >> 4).view(n, -1, 8, 4)  # [n, nb, g, t]
    high = (hi << torch.arange(8, dtype=torch.uint8).view(8, 1)).sum(2, dtype=torch.uint8)  # [n, nb, t]
    return torch.cat([low, high], dim=-1).reshape(n, -1)


def _q5(b: np.ndarray, qtype: str, n: int) -> BlockWeight:
    d = _f16(b[..., 0:2])
    at = 4 if qtype == "Q5_1" else 2
    q = _nibbles32(b[..., at + 4:]) | (_high_bits(b[..., at:at + 4], 32) << 4)  # [n, nb, 32] in 0..31
    mins = -16.0 * d if qtype == "Q5_0" else _f16(b[..., 2:4])  # Q5_0: d (q - 16) = d q - 16 d, both exact
    return BlockWeight(5, _pack5(torch.from_numpy(q)), _f32(d, n), _f32(mins, n))


def _q2_k(b: np.ndarray, n: int) -> BlockWeight:
    sc, qs = b[..., 0:16], b[..., 16:80]
    d, dmin = _f16(b[..., 80:82])[..., None], _f16(b[..., 82:84])[..., None]
    # qs [2 halves of 128 weights][32 bytes]: weight 128 h + 32 s + j is bits 2s of byte 32 h + j
    q = (qs.reshape(n, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)) & 3
    return BlockWeight(8, torch.from_numpy(q.reshape(n, -1)), _f32(d * (sc & 0xF), n),
                       _f32(-(dmin * (sc >> 4).astype(np.float32)), n))


def _q3_k(b: np.ndarray, n: int) -> BlockWeight:
    hmask, qs, packed, d = b[..., 0:32], b[..., 32:96], b[..., 96:108], _f16(b[..., 108:110])[..., None]
    low = (packed[..., 0:8, None] >> np.array([0, 4], np.uint8)).swapaxes(-1, -2).reshape(n, -1, 16)
    high = (packed[..., 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)).swapaxes(-1, -2).reshape(n, -1, 16)
    sc = ((low & 0x0F) | ((high & 3) << 4)).astype(np.int8) - 32  # [n, nb, 16] in -32..31
    ql = (qs.reshape(n, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)) & 3
    hm = (hmask.reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1  # [n, nb, 8, 32]
    # q = ql - 4 (1 - hm) in -4..3; stored + 4: ql + 4 hm in 0..7
    q = ql.reshape(n, -1, 8, 32) + (hm << 2)
    dl = d * sc.astype(np.float32)
    return BlockWeight(8, torch.from_numpy(q.reshape(n, -1)), _f32(dl, n), _f32(-4.0 * dl, n))


def _q4_k(b: np.ndarray, n: int) -> BlockWeight:
    t = torch.from_numpy(b)  # [n, nb, 144], torch for the byte shuffles (numpy is slow on short rows)
    d, dmin = _t16(t[..., 0:2]), _t16(t[..., 2:4])  # [n, nb, 1]
    sc, m = _k_scale_min(t[..., 4:16])
    # qs: 4 chunks of 32 bytes, low nibbles sub-block 2c, high nibbles 2c + 1; the 4-bit BlockWeight byte j
    # of a sub-block is q_j | q_{j+16} << 4, so each chunk's first and second 16 bytes interleave
    chunks = t[..., 16:].reshape(n, -1, 4, 2, 16)
    lo, hi = chunks[..., 0, :], chunks[..., 1, :]
    qs = torch.stack([(lo & 15) | ((hi & 15) << 4), (lo >> 4) | (hi & 0xF0)], dim=3)  # [n, nb, 4, 2, 16]
    factors = KFactors(d.reshape(n, -1), sc.reshape(n, -1).short(), dmin.reshape(n, -1), m.reshape(n, -1).short())
    return BlockWeight(4, qs.reshape(n, -1), (d * sc).reshape(n, -1), (-(dmin * m)).reshape(n, -1), factors)


def _q5_k(b: np.ndarray, n: int) -> BlockWeight:
    t = torch.from_numpy(b)  # [n, nb, 176]
    d, dmin = _t16(t[..., 0:2]), _t16(t[..., 2:4])
    sc, m = _k_scale_min(t[..., 4:16])
    qh, qs = t[..., 16:48], t[..., 48:]
    ql = (qs.reshape(n, -1, 4, 1, 32) >> torch.tensor([0, 4], dtype=torch.uint8).view(1, 1, 1, 2, 1)) & 15
    hi = (qh.reshape(n, -1, 1, 32) >> torch.arange(8, dtype=torch.uint8).view(1, 1, 8, 1)) & 1
    q = ql.reshape(n, -1, 8, 32) | (hi << 4)
    return BlockWeight(5, _pack5(q.reshape(n, -1, 32)), (d * sc).reshape(n, -1), (-(dmin * m)).reshape(n, -1))


def _q6_k(b: np.ndarray, n: int) -> BlockWeight:
    t = torch.from_numpy(b)  # [n, nb, 210]
    ql, qh = t[..., 0:128], t[..., 128:192]
    sc = t[..., 192:208].contiguous().view(torch.int8)  # [n, nb, 16]
    d = _t16(t[..., 208:210])  # [n, nb, 1]
    # low 4 bits: weight 128 h + 64 nib + 32 jb + i is nibble nib of ql[64 h + 32 jb + i], so sub-block
    # 4h + 2nib + jb's 4-bit BlockWeight bytes (q_i | q_{i+16} << 4) pair ql bytes i and i + 16
    pairs = ql.reshape(n, -1, 2, 2, 2, 16)  # [n, nb, h, jb, i / 16, 16]
    a, c = pairs[..., 0, :], pairs[..., 1, :]
    low = torch.stack([(a & 15) | ((c & 15) << 4), (a >> 4) | (c & 0xF0)], dim=3)  # [n, nb, h, nib, jb, 16]
    # high 2 bits: weight 128 h + 32 s + j is bits 2s of qh[32 h + j]; a block's byte 4p + t holds, in bits
    # 2i, those of its weight 8i + 4p + t
    hq = qh.reshape(n, -1, 2, 1, 4, 8)  # [n, nb, h, 1, i, 4p + t]
    parts = (hq >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 1, 4, 1, 1)) & 3  # [n, nb, h, s, i, 8]
    high = parts[..., 0, :] | (parts[..., 1, :] << 2) | (parts[..., 2, :] << 4) | (parts[..., 3, :] << 6)
    qs = torch.cat([low.reshape(n, -1, 8, 16), high.reshape(n, -1, 8, 8)], dim=3)  # [n, nb256, 8, 24]
    dl = (d * sc).reshape(n, -1)
    factors = KFactors(d.reshape(n, -1), sc.reshape(n, -1).short())
    return BlockWeight(6, qs.reshape(n, -1), dl, -32.0 * dl, factors)


_K_READERS = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def dense_from_gguf(data: np.ndarray, qtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """An F32 / F16 / BF16 GGUF tensor's data (any numpy view of its bytes) as a torch tensor of its own
    dtype and `shape` (a view of `data`: no copy)."""
    if qtype not in DENSE_TYPES:
        raise ValueError(f"{qtype} is not a dense GGUF type")
    arr = np.ascontiguousarray(data)
    if qtype == "BF16":
        t = torch.from_numpy(arr.view(np.uint8).reshape(-1).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(arr)
    return t.reshape(shape)
