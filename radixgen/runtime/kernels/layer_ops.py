"""Fused per-token layer ops for the float32 CPU forward (`csrc/layer_ops.c`): residual add +
RMSNorm, SiLU(gate) * up, GELU(gate) * up, and (q/k head norms +) rotary embedding + K/V store. Each
replaces several torch ops whose dispatch, not arithmetic, dominates at decode batch sizes. `lib`
arguments pick the kernel library (default: the native one; tests pass the scalar reference)."""

from __future__ import annotations

import ctypes

import torch

from radixgen.runtime.kernels import ffi


def available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and ffi.library() is not None


def _check(name: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"{name}: tensors must be contiguous CPU tensors")


def add_rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None,
                 lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """h [T, n] float32 (updated in place to h + delta when delta is given) -> RMSNorm(h) * weight [T, n]."""
    _check("add_rms_norm", h, weight, *([delta] if delta is not None else []))
    t, n = h.shape
    out = torch.empty_like(h)
    (lib or ffi.library()).add_rms_norm(h.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(),
                                        t, n, eps, out.data_ptr(), ffi.kernel_threads())
    return out


def silu_mul(gate_up: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """[T, 2 I] = [gate | up] float32 -> silu(gate) * up [T, I]."""
    _check("silu_mul", gate_up)
    t, two_i = gate_up.shape
    out = gate_up.new_empty((t, two_i // 2))
    (lib or ffi.library()).silu_mul(gate_up.data_ptr(), t, two_i // 2, out.data_ptr(), ffi.kernel_threads())
    return out


def gelu_mul(gate_up: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """[T, 2 I] = [gate | up] float32 -> gelu_tanh(gate) * up [T, I] (GeGLU)."""
    _check("gelu_mul", gate_up)
    t, two_i = gate_up.shape
    out = gate_up.new_empty((t, two_i // 2))
    (lib or ffi.library()).gelu_mul(gate_up.data_ptr(), t, two_i // 2, out.data_ptr(), ffi.kernel_threads())
    return out


def rope_store(
    qkv: torch.Tensor,  # [T, (H + 2 Hkv) D] float32, rotated in place
    heads: int,
    kv_heads: int,
    cos: torch.Tensor,  # [P, D/2]
    sin: torch.Tensor,  # [P, D/2]
    positions: torch.Tensor,  # [T] int64
    loc: torch.Tensor,  # [T] int64 KV slots
    k_buffer: torch.Tensor,  # [N, Hkv, D] float32, bfloat16 or float16; int8 rows [N, Hkv, D + 4]
    v_buffer: torch.Tensor,  # same shape and dtype
    q_norm: torch.Tensor | None = None,  # [D] per-head RMSNorm weight of q (Qwen3, Gemma 3), None: none
    k_norm: torch.Tensor | None = None,  # [D] the same of k
    eps: float = 1e-6,  # the q/k norms' epsilon
    lib: ctypes.CDLL | None = None,
) -> None:
    """Per-head RMSNorm of q and k (where given), their rotary embedding (in place), and the store of k,
    v at their KV slots (converted to the buffers' dtype, rounding to nearest even as torch does; int8
    rows quantized as `radix_cache.kv_quant.quantize`)."""
    norms = [n for n in (q_norm, k_norm) if n is not None]
    _check("rope_store", qkv, cos, sin, positions, loc, k_buffer, v_buffer, *norms)
    t = qkv.shape[0]
    d = qkv.shape[1] // (heads + 2 * kv_heads)
    (lib or ffi.library()).rope_store(qkv.data_ptr(), t, heads, kv_heads, d, cos.data_ptr(), sin.data_ptr(),
                                      positions.data_ptr(), loc.data_ptr(), k_buffer.data_ptr(), v_buffer.data_ptr(),
                                      ffi.kv_dtype_code(k_buffer.dtype), None if q_norm is None else q_norm.data_ptr(),
                                      None if k_norm is None else k_norm.data_ptr(), eps, ffi.kernel_threads())
