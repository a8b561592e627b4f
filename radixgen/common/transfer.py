"""Host -> device copies that do not stall the host on the GPU's queue.

A plain `.to("cuda")` from pageable memory makes the host wait until the copy (and so all work queued
before it) is done. Staging the tensor in pinned memory (PyTorch caches pinned blocks) and copying
with `non_blocking=True` keeps the scheduler running ahead of the GPU; the copy is ordered on the
stream, so kernels queued after it see the data.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` (a CPU tensor) on `device`; for a CPU device, `t` itself."""
    device = torch.device(device)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)
