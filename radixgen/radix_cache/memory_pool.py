"""KV memory pools.

`ReqToTokenPool` maps a request slot to the KV slot of each of its tokens (one int64 row per
request); `TokenToKVPool` holds per-layer K/V tensors indexed by KV slot, plus a free list of
slots. Slot 0 of the KV pool is reserved as a padding target and never handed out, so the pool's
capacity is `size` usable slots (1..size). The allocator works without any tensors so the radix
tree can be tested with a fake pool (`TokenAllocator` alone).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from radixgen.common.transfer import to_device
from radixgen.radix_cache import kv_quant
from radixgen.radix_cache.host_memory import empty_kv_buffer


class TokenAllocator:
    """Free list of KV slots 1..size (0 is the reserved padding slot)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"KV pool size must be >= 1, got {size}")
        self.size = size
        self.clear()

    def clear(self) -> None:
        self._free = torch.arange(1, self.size + 1, dtype=torch.int64)  # [free]
        self._n_free = self.size

    def available_size(self) -> int:
        return self._n_free

    def free_slots(self) -> torch.Tensor:
        """The free slots (int64 [available_size()], a view: read only)."""
        return self._free[: self._n_free]

    def alloc(self, n: int) -> torch.Tensor | None:
        """Take `n` free slots (int64 [n]) or return None when fewer are free."""
        if n > self._n_free:
            return None
        out = self._free[self._n_free - n : self._n_free].clone()
        self._n_free -= n
        return out

    def free(self, indices: torch.Tensor) -> None:
        """Return slots to the pool. Freeing a slot twice is a bug the caller must not make."""
        n = int(indices.numel())
        if n == 0:
            return
        end = self._n_free + n
        if end > self.size:
            raise RuntimeError(f"KV pool over-freed: {end} free slots > capacity {self.size}")
        self._free[self._n_free : end] = indices.to(torch.int64).reshape(-1)
        self._n_free = end


class TokenToKVPool:
    """Per-layer K and V buffers, each [size + 1, num_kv_heads, head_dim], and their allocator.
    With dtype int8, each buffer is [size + 1, num_kv_heads, head_dim + 4]: int8 rows with their
    scales (`kv_quant`)."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
    ) -> None:
        self.size = size
        self.dtype = dtype
        self.allocator = TokenAllocator(size)
        shape = (size + 1, num_kv_heads, kv_quant.row_width(head_dim, dtype))
        # Uninitialised (a slot is written before it is read; on CPU untouched pages cost no memory, and
        # huge pages make the first write to new slots cheap: see host_memory), except the padding
        # slot 0: masked-out keys read it, so it must hold finite values.
        self.k_buffer = [empty_kv_buffer(shape, dtype, device) for _ in range(num_layers)]
        self.v_buffer = [empty_kv_buffer(shape, dtype, device) for _ in range(num_layers)]
        for buf in (*self.k_buffer, *self.v_buffer):
            buf[0].zero_()

    def alloc(self, n: int) -> torch.Tensor | None:
        return self.allocator.alloc(n)

    def free(self, indices: torch.Tensor) -> None:
        self.allocator.free(indices)

    def available_size(self) -> int:
        return self.allocator.available_size()

    def set_kv(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens' K/V ([T, kv_heads, head_dim]) at slots `loc` ([T])."""
        if self.dtype == torch.int8:
            k, v = kv_quant.quantize(k), kv_quant.quantize(v)
        self.k_buffer[layer][loc] = k
        self.v_buffer[layer][loc] = v


@dataclass
class TableUpdate:
    """Writes to the device copy of req_to_token: `table.view(-1)[flat_index] = values`."""

    flat_index: torch.Tensor  # [W] int64 (host)
    values: torch.Tensor  # [W] int64 KV slots (host)


class ReqToTokenPool:
    """Request slot -> KV slots of its tokens: `req_to_token[slot, i]` is token i's KV slot.

    The scheduler reads and writes the host table `req_to_token` (no device sync); the model reads
    `device_table`, a copy on the model's device. `write` updates the host table and queues the same
    write; `take_updates` hands the queued writes to the next step, which applies them on the device
    (`apply`) in stream order before its forward, so a batch in flight never sees a later batch's
    writes. The copy is kept on CPU too, so CPU runs exercise the same path as GPU ones.
    """

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu") -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int64)  # host
        self.device_table = torch.zeros((size, max_context_len), dtype=torch.int64, device=device)
        self._pending_index: list[torch.Tensor] = []
        self._pending_values: list[torch.Tensor] = []
        self._free = list(range(size))

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def clear(self) -> None:
        self._free = list(range(self.size))

    def write(self, slot: int, start: int, values: torch.Tensor) -> None:
        """Set `req_to_token[slot, start : start + len(values)]` and queue it for the device copy."""
        self.write_runs([slot], [start], [int(values.numel())], values.clone())

    def write_runs(self, slots: list[int], starts: list[int], lens: list[int], values: torch.Tensor) -> None:
        """Set `req_to_token[slots[i], starts[i] : starts[i] + lens[i]]` for every i from consecutive runs
        of `values` ([sum(lens)], which the pool keeps: not to be changed after), as one write: a step's
        whole allocation costs a few tensor ops, not a few per request."""
        values = values.to(torch.int64).reshape(-1)  # [W]
        if sum(lens) != values.numel():
            raise ValueError(f"runs of {sum(lens)} slots in all, but {values.numel()} values")
        if values.numel() == 0:
            return
        if any(start + n > self.max_context_len for start, n in zip(starts, lens, strict=True)):
            raise ValueError(f"a run past the end of its row ({self.max_context_len} slots)")
        firsts = [slot * self.max_context_len + start for slot, start in zip(slots, starts, strict=True)]
        if all(n == 1 for n in lens):  # one value per run (a decode step)
            index = torch.tensor(firsts, dtype=torch.int64)  # [W]
        else:  # run i's j-th value goes to firsts[i] + j
            offsets = [0, *itertools.accumulate(lens[:-1])]  # [R] each run's first value in `values`
            shift = torch.tensor([f - o for f, o in zip(firsts, offsets, strict=True)], dtype=torch.int64)  # [R]
            index = torch.arange(values.numel()) + shift.repeat_interleave(torch.tensor(lens))  # [W]
        self.req_to_token.view(-1)[index] = values
        self._pending_index.append(index)
        self._pending_values.append(values)

    def take_updates(self) -> TableUpdate | None:
        """The writes queued since the last call (None if there were none)."""
        if not self._pending_index:
            return None
        if len(self._pending_index) == 1:
            update = TableUpdate(self._pending_index[0], self._pending_values[0])
        else:
            update = TableUpdate(torch.cat(self._pending_index), torch.cat(self._pending_values))
        self._pending_index, self._pending_values = [], []
        return update

    def apply(self, update: TableUpdate | None) -> None:
        """Apply queued writes to `device_table` (one scatter; call on the thread running the model)."""
        if update is None:
            return
        device = self.device_table.device
        self.device_table.view(-1).index_copy_(
            0, to_device(update.flat_index, device), to_device(update.values, device)
        )
