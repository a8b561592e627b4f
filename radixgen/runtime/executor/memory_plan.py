"""How many tokens the KV pool holds, decided before anything large is allocated.

As in SGLang, `mem_fraction_static` is the share of the memory available at start-up that the static
allocations (weights and KV pool) may take: the pool gets that share less the weights, unless
`max_total_tokens` names its size. The weights' resident size is estimated from the checkpoint (a
GGUF's matrices in the block kernel's formats, `Checkpoint.resident_bytes`), so a model that does not
fit is refused with the numbers before its weights are read. Memory is MemAvailable (capped by a
cgroup limit) on CPU, the device's free memory on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

GIB = 1 << 30


@dataclass(frozen=True)
class MemoryPlan:
    """The numbers behind a KV pool size (bytes, except tokens)."""

    available: int
    weights: int
    kv_per_token: int
    kv_tokens: int

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.kv_per_token


def available_memory(device: torch.device) -> int:
    """Bytes this process can still use: free GPU memory, or on CPU MemAvailable, capped by the cgroup's
    limit less its usage where one is set."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    avail = int(fields["MemAvailable"].split()[0]) * 1024
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            avail = min(avail, int(limit) - used)
    except (OSError, ValueError):
        pass
    return avail


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, kv_dtype: torch.dtype) -> int:
    """K and V of one token in every layer (int8 rows carry a float32 scale per head)."""
    row = head_dim + 4 if kv_dtype == torch.int8 else head_dim * kv_dtype.itemsize
    return 2 * num_layers * kv_heads * row


def plan_kv(available: int, weights: int, kv_per_token: int, fraction: float, max_total_tokens: int | None,
            most_useful: int, what: str) -> MemoryPlan:
    """The pool for `what` (a model's name): `max_total_tokens` if given, else `fraction` of `available`
    less `weights`, at most `most_useful` tokens (every request slot at full context). ValueError, with
    the numbers, where the weights or the pool do not fit."""
    gib = lambda b: f"{b / GIB:.2f} GiB"
    if weights > available:
        raise ValueError(f"{what} does not fit: its weights take about {gib(weights)} and {gib(available)} of memory "
                         f"is available; free memory, or use a smaller or more quantized model")
    if max_total_tokens is not None:
        need = weights + max_total_tokens * kv_per_token
        if need > available:
            kv = gib(max_total_tokens * kv_per_token)
            raise ValueError(f"{what} with a KV pool of max_total_tokens={max_total_tokens} needs about {gib(need)} "
                             f"(weights {gib(weights)} + KV {kv}) but {gib(available)} is available: lower "
                             f"max_total_tokens, or leave it unset to size the pool by mem_fraction_static")
        return MemoryPlan(available, weights, kv_per_token, max_total_tokens)
    budget = int(fraction * available) - weights
    tokens = min(budget // kv_per_token, most_useful) if budget > 0 else 0
    if tokens < 16:
        raise ValueError(f"{what}: mem_fraction_static={fraction} of the {gib(available)} available leaves "
                         f"{gib(max(budget, 0))} for the KV pool after the weights ({gib(weights)}), under 16 tokens "
                         f"of {kv_per_token} bytes: raise mem_fraction_static or set max_total_tokens")
    return MemoryPlan(available, weights, kv_per_token, int(tokens))
