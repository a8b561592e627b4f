"""Seeded sampling's draw in C for CPU logits (`csrc/sample_draw.c`): temperature, top-k, top-p and
min-p cuts by radix selects instead of torch's topk-then-sort, and the inverse-CDF draw with the torch
sampler's uniforms. The worker hands `draw_rows` to the torch sampler on CPU: at a 262k vocabulary
torch's cuts take 2-3 ms a row, and 25 ms where the nucleus is wide (a chat's first token)."""

from __future__ import annotations

import ctypes

import torch

from radixgen.runtime.kernels import ffi
from radixgen.sampling.torch_ops import SamplingBatch, counter_uniform


def draw_rows(logits: torch.Tensor, batch: SamplingBatch, lib: ctypes.CDLL | None = None) -> torch.Tensor | None:
    """Tokens [B] int64 drawn from processed logits [B, V] float32 (CPU) as `torch_ops.sample` draws them
    for non-greedy rows (same uniforms; a token exactly on a cut may fall the other way, as the cuts'
    masses are summed in another order); None where the kernel cannot run (the caller uses torch's)."""
    lib = lib or ffi.library()
    if lib is None or logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2:
        return None
    b, v = logits.shape
    x = logits.contiguous()
    inv_temp = batch.inv_temperatures.to(torch.float32).contiguous()  # [B]
    top_k = batch.top_ks.to(torch.int64).contiguous()  # [B]
    top_p = batch.top_ps.to(torch.float32).contiguous()  # [B]
    log_min_p = batch.log_min_ps.to(torch.float32).contiguous()  # [B], -inf: no min-p
    u = counter_uniform(batch.seeds, batch.steps).contiguous()  # [B] float32
    out = torch.empty(b, dtype=torch.int64)
    rc = lib.sample_draw(x.data_ptr(), b, v, inv_temp.data_ptr(), top_k.data_ptr(), top_p.data_ptr(),
                         log_min_p.data_ptr(), u.data_ptr(), out.data_ptr(), ffi.kernel_threads())
    return out if rc == 0 else None
