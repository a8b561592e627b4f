"""A tensor-parallel group on torch.distributed: the collectives the layers use and the batch broadcast.

Three process groups over the same ranks:
- the default group (`nccl` on CUDA, `gloo` on CPU) carries the model's all-reduces and the logits
  gather, with a timeout (RADIXGEN_TP_TIMEOUT seconds, default 300): a rank that stops answering
  fails the step instead of hanging it. A rank that dies closes its connections, which fails the
  next collective at once;
- `control` (gloo, CPU) carries each step's header from rank 0. Ranks other than 0 wait there
  between steps, for as long as the engine is idle, so its timeout is long; they still notice at
  once when rank 0 exits (its connections close);
- `payload` (gloo, CPU) carries the step's index tensors (`wire.py`).

A process belongs to at most one group at a time (torch.distributed keeps one default group per
process); `close` leaves it so a later engine of the same process can form another.
"""

from __future__ import annotations

import datetime
import os
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from radixgen.runtime.distributed import wire
from radixgen.runtime.executor.forward_batch import ForwardBatch

TIMEOUT_S = float(os.environ.get("RADIXGEN_TP_TIMEOUT", "300"))
IDLE_TIMEOUT = datetime.timedelta(days=7)  # ranks > 0 waiting for rank 0's next step


class TPGroup:
    """This process's rank in a tensor-parallel group of `size` ranks meeting at `addr` (host:port)."""

    def __init__(self, rank: int, size: int, addr: str, device: torch.device,
                 alive: Callable[[], str | None] | None = None) -> None:
        """Join the group; `alive` (rank 0) is polled while waiting for the others and returns why a
        rank cannot come (it exited) or None."""
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a torch.distributed group: run one tensor-parallel "
                               "engine per process (shut the other one down first)")
        self.rank, self.size, self.device = rank, size, device
        backend = "nccl" if device.type == "cuda" else "gloo"

        def join() -> None:
            dist.init_process_group(backend, init_method=f"tcp://{addr}", rank=rank, world_size=size,
                                    timeout=datetime.timedelta(seconds=TIMEOUT_S))
            self.control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
            self.payload = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))

        _run_watched(join, alive, f"forming the tensor-parallel group at {addr}")
        self.closed = False

    # ------------------------------------------------------------------ layers (Collectives)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    def gather_first(self, t: torch.Tensor) -> list[torch.Tensor] | None:
        parts = [torch.empty_like(t) for _ in range(self.size)] if self.rank == 0 else None
        dist.gather(t, parts, dst=0)
        return parts

    # ------------------------------------------------------------------ steps

    def send_batch(self, fb: ForwardBatch) -> None:
        """Rank 0: announce a step and send its inputs."""
        header, payload = wire.pack(fb)
        dist.broadcast(header, 0, group=self.control)
        dist.broadcast(payload, 0, group=self.payload)

    def recv_batch(self) -> ForwardBatch | None:
        """Ranks > 0: the next step's inputs (on this rank's device), or None when rank 0 stops."""
        header = wire.empty_header()
        dist.broadcast(header, 0, group=self.control)
        if wire.is_stop(header):
            dist.barrier(group=self.payload)  # tell rank 0 the stop arrived before anyone disconnects
            return None
        payload = wire.empty_payload(header)
        dist.broadcast(payload, 0, group=self.payload)
        return wire.unpack(header, payload, self.device)

    def send_stop(self) -> None:
        """Rank 0: end the other ranks' loops; returns once every rank has the message."""
        dist.broadcast(wire.stop_header(), 0, group=self.control)
        dist.barrier(group=self.payload)

    def check_startup(self, error: str | None) -> None:
        """Every rank reports whether it loaded; raise on every rank if any failed (with the reasons)."""
        reports: list[str | None] = [None] * self.size
        dist.all_gather_object(reports, error, group=self.payload)
        failed = [f"rank {r}: {e}" for r, e in enumerate(reports) if e is not None]
        if failed:
            raise RuntimeError("tensor-parallel start-up failed: " + "; ".join(failed))

    def close(self) -> None:
        """Leave the group (this process may then form or join another)."""
        if not self.closed:
            self.closed = True
            dist.destroy_process_group()


def _run_watched(fn: Callable[[], None], alive: Callable[[], str | None] | None, what: str) -> None:
    """Run `fn` (which blocks until every rank arrives) on a helper thread, polling `alive` meanwhile,
    so that a rank that died before arriving fails start-up at once instead of after the timeout."""
    if alive is None:
        fn()
        return
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # re-raised on the caller's thread
            errors.append(e)

    thread = threading.Thread(target=run, name="radixgen-tp-join", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
        dead = alive()
        if dead is not None and thread.is_alive():
            raise RuntimeError(f"{dead} while {what}; see its error output above")
    if errors:
        raise errors[0]
