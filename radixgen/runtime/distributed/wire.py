"""A ForwardBatch as two int64 tensors for the broadcast from rank 0: a fixed header and a payload.

header [5]: op (1 = forward, 0 = stop), T new tokens, B requests, L logits rows, W req_to_token writes.
payload [3T + 3B + L + 2W]: input_ids, positions, out_cache_loc (T each), req_pool_indices,
prefix_lens, extend_lens (B each), logits_indices (L), the table update's flat indices and values (W each).
Rank 0 packs the batch after resolving placeholder inputs, so the ids it sampled in the previous
step reach the other ranks inside this step's input_ids; all ranks then apply the same
req_to_token writes and KV slot indices.
"""

from __future__ import annotations

import torch

from radixgen.radix_cache.memory_pool import TableUpdate
from radixgen.runtime.executor.forward_batch import ForwardBatch

FORWARD, STOP = 1, 0
HEADER_LEN = 5


def empty_header() -> torch.Tensor:
    return torch.zeros(HEADER_LEN, dtype=torch.int64)


def stop_header() -> torch.Tensor:
    return torch.tensor([STOP, 0, 0, 0, 0], dtype=torch.int64)


def is_stop(header: torch.Tensor) -> bool:
    return int(header[0]) == STOP


def pack(fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(header, payload) of `fb` (CPU int64)."""
    if fb.has_placeholders and bool((fb.input_ids < 0).any()):
        raise ValueError("resolve placeholder input ids before broadcasting a batch")
    upd = fb.table_update
    empty = torch.zeros(0, dtype=torch.int64)
    index, values = (upd.flat_index, upd.values) if upd is not None else (empty, empty)
    t, b, n_logits, w = fb.input_ids.numel(), fb.batch_size, fb.logits_indices.numel(), index.numel()
    parts = [fb.input_ids, fb.positions, fb.out_cache_loc, fb.req_pool_indices,
             torch.tensor(fb.prefix_lens, dtype=torch.int64), torch.tensor(fb.extend_lens, dtype=torch.int64),
             fb.logits_indices, index, values]
    payload = torch.cat([p.to("cpu", torch.int64).reshape(-1) for p in parts])  # [3T + 3B + L + 2W]
    return torch.tensor([FORWARD, t, b, n_logits, w], dtype=torch.int64), payload


def empty_payload(header: torch.Tensor) -> torch.Tensor:
    _, t, b, n_logits, w = header.tolist()
    return torch.empty(3 * t + 3 * b + n_logits + 2 * w, dtype=torch.int64)


def unpack(header: torch.Tensor, payload: torch.Tensor, device: torch.device) -> ForwardBatch:
    """The ForwardBatch of (header, payload), its index tensors on `device` (the update stays on the host)."""
    _, t, b, n_logits, w = header.tolist()
    inputs, prefix, extend, logits, index, values = payload.split([3 * t + b, b, b, n_logits, w, w])
    dev = inputs.to(device)  # [3T + B]
    return ForwardBatch(
        input_ids=dev[:t], positions=dev[t : 2 * t], out_cache_loc=dev[2 * t : 3 * t],
        req_pool_indices=dev[3 * t : 3 * t + b], prefix_lens=prefix.tolist(), extend_lens=extend.tolist(),
        logits_indices=logits.to(device), table_update=TableUpdate(index, values) if w else None,
    )
