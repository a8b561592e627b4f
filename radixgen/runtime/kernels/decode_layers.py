"""All decoder layers of a pure-decode CPU step in one C call (`csrc/decode_layers.c`).

The per-op float32 CPU path already runs every GEMM, attention and per-token op in C, but calls
them from Python: ~12 ctypes calls a layer, each 5-10 us of argument checks, tensor allocation and
GIL traffic, 2-4 ms of a SmolLM2 decode step (9 ms at batch 1). `decode_layers` runs the same kernels
in the same order, so its result is bitwise the per-op path's. It takes a table of every layer's
weight and KV-buffer pointers, built once per KV pool.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from radixgen.radix_cache.memory_pool import TokenToKVPool
from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.kernels import build as cpu_kernels
from radixgen.runtime.kernels.block_gemm import BLOCK_MAX_ROWS, PanelWeight
from radixgen.runtime.layers.attention import AttentionMetadata, DecodeCall

MATRICES = ("qkv", "o_proj", "gate_up", "down")  # in the table's order (csrc/decode_layers.c F_*)

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
SIGNATURES: cpu_kernels.Signatures = {
    "decode_layers": (ctypes.c_int, [_P, _I, _P, _I, _I, _I, _I, _I, _I, _F, _F, _P, _P, _P, _P, _P, _I, _P, _P, _P,
                                     _I, ctypes.c_int]),
    "decode_layers_fields": (ctypes.c_int, []),
}


@functools.cache
def library() -> ctypes.CDLL | None:
    return cpu_kernels.load(SIGNATURES)


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


class FusedDecode:
    """The layer table of one model over one KV pool, and the call that runs a decode step on it."""

    def __init__(self, layers: torch.nn.ModuleList, pool: TokenToKVPool) -> None:
        rows = []
        for layer in layers:
            row = [_ptr(layer.input_norm), _ptr(layer.post_attn_norm), _ptr(pool.k_buffer[layer.layer_id]),
                   _ptr(pool.v_buffer[layer.layer_id])]
            for name in MATRICES:
                w: PanelWeight = layer._blocks[name]
                row += [w.bits, _ptr(w.qs), _ptr(w.scale), _ptr(w.minv)]
            rows.append(row)
        self.table = torch.tensor(rows, dtype=torch.int64)  # [layers, fields]; the tensors it points to live
        # as long as the model and the pool, which own this object
        if self.table.shape[1] != library().decode_layers_fields():
            raise RuntimeError("decode_layers: the layer table does not match csrc/decode_layers.c")
        first = layers[0]
        self.dims = (first.num_heads, first.num_kv_heads, first.head_dim, first._blocks["down"].shape[1])
        self.eps, self.scale = first.eps, first.scale

    @staticmethod
    def supported(layers: torch.nn.ModuleList, pool: TokenToKVPool) -> bool:
        """Whether every layer runs fused ops on block weights (no qkv bias: GGUF llama) over a float32
        CPU pool."""
        return (library() is not None and pool.k_buffer[0].dtype == torch.float32
                and pool.k_buffer[0].device.type == "cpu"
                and all(layer.fused_ops and layer.qkv_bias is None and all(n in layer._blocks for n in MATRICES)
                        for layer in layers))

    @staticmethod
    def call_of(h: torch.Tensor, meta: object) -> DecodeCall | None:
        """The step's single decode call if this step is pure decode within the block kernel's rows."""
        if not isinstance(meta, AttentionMetadata) or len(meta.calls) != 1 or h.shape[0] > BLOCK_MAX_ROWS:
            return None
        call = meta.calls[0]
        return call if isinstance(call, DecodeCall) and call.rows is None else None

    def run(self, h: torch.Tensor, fb: ForwardBatch, call: DecodeCall, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """h [T, hidden] float32 (contiguous) through every layer, in place."""
        t, hidden = h.shape
        heads, kv_heads, head_dim, inter = self.dims
        shared = call.shared.contiguous() if call.shared is not None else None
        # held until the call returns: C reads their memory
        positions, loc = fb.positions.contiguous(), fb.out_cache_loc.contiguous()
        rows, seq_lens = call.req_rows.contiguous(), call.seq_lens.contiguous()
        rc = library().decode_layers(
            self.table.data_ptr(), self.table.shape[0], h.data_ptr(), t, hidden, heads, kv_heads, head_dim, inter,
            self.eps, self.scale, cos.data_ptr(), sin.data_ptr(), positions.data_ptr(), loc.data_ptr(),
            call.req_to_token.data_ptr(), call.req_to_token.shape[1], rows.data_ptr(), seq_lens.data_ptr(),
            _ptr(shared), 0 if shared is None else shared.numel(), torch.get_num_threads(),
        )
        if rc != 0:
            raise RuntimeError(f"decode_layers failed ({t} tokens, heads {heads}/{kv_heads}, or out of memory)")
