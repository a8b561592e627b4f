"""ForwardBatch: one model step's inputs for a mix of extend (prefill) and decode requests.

All new tokens of the step are concatenated into one flat sequence of T tokens; request i owns
`extend_lens[i]` of them, continuing its cached prefix of `prefix_lens[i]` tokens. A decode request
is an extend of length 1. K/V are read and written through the KV pool by slot index.
The index tensors reach the model's device in one pinned, non-blocking copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixgen.common.transfer import to_device
from radixgen.radix_cache.memory_pool import TableUpdate


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64, new tokens of all requests, concatenated
    positions: torch.Tensor  # [T] int64, position of each new token in its sequence
    out_cache_loc: torch.Tensor  # [T] int64, KV slot each new token's K/V is written to
    req_pool_indices: torch.Tensor  # [B] int64, each request's row in req_to_token
    prefix_lens: list[int]  # [B] tokens already in the KV cache before this step
    extend_lens: list[int]  # [B] new tokens this step (1 for decode)
    logits_indices: torch.Tensor  # [L] int64 rows of the flat sequence whose logits are returned, ascending
    has_placeholders: bool = False  # some input ids are -(i + 1): the i-th token the previous step samples
    all_placeholders: bool = False  # input id j is -(j + 1) for every j: the previous step's samples, in order
    table_update: TableUpdate | None = None  # req_to_token writes to apply on the device first
    hidden_indices: torch.Tensor | None = None  # [H] int64 rows whose final hidden states are wanted (embeddings)
    hidden_out: torch.Tensor | None = None  # [H, hidden] float32: the final norm's output there, set by the forward
    before_kernels: Callable[[], None] | None = None  # the caller's, run once the step's host-side setup is done

    def kernels_start(self) -> None:
        """Called by the model once its host-side setup of the step is done and its kernels start: runs
        `before_kernels` (once)."""
        if self.before_kernels is not None:
            hook, self.before_kernels = self.before_kernels, None
            hook()

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens, strict=True)]

    @property
    def is_decode(self) -> bool:
        return all(e == 1 for e in self.extend_lens)


def make_forward_batch(
    new_tokens: list[list[int]],
    prefix_lens: list[int],
    req_pool_indices: list[int],
    out_cache_loc: torch.Tensor,
    logits_rows: list[list[int]] | None = None,
    device: torch.device | str = "cpu",
    table_update: TableUpdate | None = None,
    hidden_rows: list[list[int]] | None = None,
) -> ForwardBatch:
    """Build a ForwardBatch from per-request new tokens.

    `logits_rows[i]` lists the offsets (within request i's new tokens) whose logits are wanted;
    default: the last new token of each request. `hidden_rows[i]` likewise lists those whose final
    hidden states are wanted (embedding requests; default: none).
    """
    extend_lens = [len(t) for t in new_tokens]
    flat = [tok for toks in new_tokens for tok in toks]
    positions = [p + j for p, e in zip(prefix_lens, extend_lens, strict=True) for j in range(e)]
    rows, hidden, start = [], [], 0
    for i, e in enumerate(extend_lens):
        wanted = logits_rows[i] if logits_rows is not None else [e - 1]
        rows.extend(start + j for j in wanted)
        if hidden_rows is not None:
            hidden.extend(start + j for j in hidden_rows[i])
        start += e
    t, b = len(flat), len(extend_lens)
    host = torch.tensor(flat + positions + req_pool_indices + rows, dtype=torch.int64)  # [2T + B + L]
    packed = torch.cat([host, out_cache_loc.to(torch.int64).reshape(-1)])  # [3T + B + L]
    dev = to_device(packed, torch.device(device))
    return ForwardBatch(
        input_ids=dev[:t],
        positions=dev[t : 2 * t],
        out_cache_loc=dev[2 * t + b + len(rows) :],
        req_pool_indices=dev[2 * t : 2 * t + b],
        prefix_lens=list(prefix_lens),
        extend_lens=extend_lens,
        logits_indices=dev[2 * t + b : 2 * t + b + len(rows)],
        has_placeholders=any(tok < 0 for tok in flat),
        all_placeholders=flat == list(range(-1, -t - 1, -1)),
        table_update=table_update,
        hidden_indices=to_device(torch.tensor(hidden, dtype=torch.int64), torch.device(device)) if hidden else None,
    )
