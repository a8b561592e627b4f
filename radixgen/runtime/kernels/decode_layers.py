"""All decoder layers of a pure-decode CPU step in one C call (`csrc/decode_layers.c`).

The per-op float32 CPU path already runs every GEMM, attention and per-token op in C, but calls
them from Python: ~12 ctypes calls a layer, each 5-10 us of argument checks, tensor allocation and
GIL traffic, 2-4 ms of a SmolLM2 decode step (9 ms at batch 1). `decode_layers` runs the same kernels
in the same order, so its result is bitwise the per-op path's. It takes an array of every layer's
weight and KV-buffer pointers (`rg_layer` structs, built once per KV pool) and one `rg_decode_step`.
The model assembles the layers (`LlamaModel.prepare`); this module knows no model.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from radixgen.runtime.kernels import ffi
from radixgen.runtime.kernels.block_gemm import PanelWeight


@dataclass
class LayerWeights:
    """One decoder layer's tensors as the C step reads them (float32 CPU, block matrices); the optional
    parts are Qwen3's and Gemma's (None / False: absent)."""

    input_norm: torch.Tensor  # [hidden]
    post_norm: torch.Tensor  # [hidden] the norm before the MLP
    k_buffer: torch.Tensor  # [N, Hkv, D] float32, bfloat16 or float16
    v_buffer: torch.Tensor  # [N, Hkv, D]
    qkv: PanelWeight
    o: PanelWeight
    gate_up: PanelWeight
    down: PanelWeight
    q_norm: torch.Tensor | None = None  # [D] per-head RMSNorm of q before the rotary
    k_norm: torch.Tensor | None = None  # [D]
    attn_out_norm: torch.Tensor | None = None  # [hidden] on the attention's output before the residual add
    mlp_out_norm: torch.Tensor | None = None  # [hidden] on the MLP's output before the residual add
    gelu: bool = False  # GeGLU (gelu_tanh(gate) * up), else SwiGLU
    local: bool = False  # a sliding-window layer: the step's window table and local rotary table


@dataclass
class WindowKeys:
    """A pure-decode step's keys for sliding-window layers where some request is past its window: token
    t attends to slots table[t, :seq_lens[t]] (`torch_backend._window_decode_call`)."""

    table: torch.Tensor  # [T, W] int64
    rows: torch.Tensor  # [T] int64 0 .. T - 1
    seq_lens: torch.Tensor  # [T] int64


@dataclass(frozen=True)
class DecodeDims:
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps: float
    scale: float


class DecodeLayers:
    """The layer array of one model over one KV pool, and the call that runs a decode step on it."""

    def __init__(self, layers: list[LayerWeights], dims: DecodeDims, max_rows: int) -> None:
        self.max_rows = max_rows  # decode rows up to which the block GEMMs apply
        ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
        self.layers = layers  # holds the tensors the structs point to
        self.table = (ffi.LayerC * len(layers))(*[
            ffi.LayerC(ptr(w.input_norm), ptr(w.post_norm), ptr(w.k_buffer), ptr(w.v_buffer), w.qkv.struct, w.o.struct,
                       w.gate_up.struct, w.down.struct, ptr(w.q_norm), ptr(w.k_norm), ptr(w.attn_out_norm),
                       ptr(w.mlp_out_norm), int(w.gelu), int(w.local))
            for w in layers])
        self.dims = dims
        self.kv_dtype = ffi.kv_dtype_code(layers[0].k_buffer.dtype)

    @staticmethod
    def available() -> bool:
        return ffi.library() is not None

    def run(self, h: torch.Tensor, positions: torch.Tensor, loc: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
            shared: torch.Tensor | None, local_cos: torch.Tensor | None = None,
            local_sin: torch.Tensor | None = None, window: WindowKeys | None = None,
            lib: ctypes.CDLL | None = None) -> None:
        """h [T, hidden] float32 (contiguous) through every layer, in place. Token t decodes request
        row rows[t] at positions[t] (K/V to slot loc[t]) over seq_lens[t] keys of req_to_token;
        `shared`: KV slots every request starts with (the cascade), or None. Sliding-window layers
        rotate by `local_cos` / `local_sin` (None: the global tables) and attend through `window`
        (None: no request is past its window, so they read as global layers). `lib`: the kernel
        library (default the native one; tests pass the scalar reference)."""
        t, hidden = h.shape
        d = self.dims
        # held until the call returns: C reads their memory
        positions, loc = positions.contiguous(), loc.contiguous()
        rows, seq_lens = rows.contiguous(), seq_lens.contiguous()
        shared = shared.contiguous() if shared is not None else None
        win = None if window is None else WindowKeys(*(x.contiguous() for x in (window.table, window.rows,
                                                                              window.seq_lens)))
        step = ffi.DecodeStepC(
            tokens=t, hidden=hidden, heads=d.heads, kv_heads=d.kv_heads, head_dim=d.head_dim, inter=d.inter,
            eps=d.eps, scale=d.scale, cos_t=cos.data_ptr(), sin_t=sin.data_ptr(), positions=positions.data_ptr(),
            loc=loc.data_ptr(), req_to_token=req_to_token.data_ptr(), table_stride=req_to_token.shape[1],
            rows=rows.data_ptr(), seq_lens=seq_lens.data_ptr(), shared=None if shared is None else shared.data_ptr(),
            n_shared=0 if shared is None else shared.numel(), kv_dtype=self.kv_dtype,
            local_cos_t=None if local_cos is None else local_cos.data_ptr(),
            local_sin_t=None if local_sin is None else local_sin.data_ptr(),
            win_table=None if win is None else win.table.data_ptr(),
            win_stride=0 if win is None else win.table.shape[1],
            win_rows=None if win is None else win.rows.data_ptr(),
            win_seq_lens=None if win is None else win.seq_lens.data_ptr())
        rc = (lib or ffi.library()).decode_layers(ctypes.byref(self.table), len(self.layers), h.data_ptr(),
                                                  ctypes.byref(step), ffi.kernel_threads())
        if rc != 0:
            raise RuntimeError(f"decode_layers failed ({t} tokens, heads {d.heads}/{d.kv_heads}, or out of memory)")
