"""Starting tensor-parallel ranks: the layout over nodes, one child process per local rank.

Ranks are numbered node by node: node k runs ranks k*L .. (k+1)*L - 1 with L = tp_size / nnodes.
Node 0's rank 0 is the Engine's own process; every other rank is a `python -m
radixgen.runtime.distributed.rank` child of its node's launcher (the Engine on node 0, `radixgen serve
--node-rank K` elsewhere). Each rank gets its node's cores divided among the node's ranks (unless
num_threads is set) and, on CUDA, the GPU of its local index.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace

from radixgen.runtime.config import EngineConfig


@dataclass(frozen=True)
class RankLayout:
    tp_size: int
    nnodes: int
    node_rank: int

    @classmethod
    def of(cls, config: EngineConfig) -> RankLayout:
        return cls(config.tp_size, config.nnodes, config.node_rank)

    @property
    def per_node(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def ranks(self) -> range:
        """The ranks this node runs."""
        return range(self.node_rank * self.per_node, (self.node_rank + 1) * self.per_node)


def rank_config(config: EngineConfig, rank: int) -> EngineConfig:
    """`config` as rank `rank` runs it: its GPU on CUDA, its share of the node's cores."""
    layout = RankLayout.of(config)
    local = rank - layout.node_rank * layout.per_node
    device = f"cuda:{local}" if config.device.startswith("cuda") else config.device
    threads = config.num_threads or max(1, (os.cpu_count() or 1) // layout.per_node)
    return replace(config, device=device, num_threads=threads)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class RankProcesses:
    """This node's ranks other than the Engine's own, as child processes."""

    def __init__(self, config: EngineConfig, addr: str, ranks: range) -> None:
        payload = json.dumps(asdict(config))
        self.procs: dict[int, subprocess.Popen] = {}
        for r in ranks:
            cmd = [sys.executable, "-m", "radixgen.runtime.distributed.rank", "--rank", str(r), "--addr", addr,
                   "--config", payload]
            self.procs[r] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)

    @property
    def pids(self) -> dict[int, int]:
        """rank -> process id."""
        return {r: p.pid for r, p in self.procs.items()}

    def failure(self, wait: float = 0.0) -> str | None:
        """Why a rank is gone ("tensor-parallel rank 1 (pid N) was killed by SIGKILL"), or None if all
        run; waits up to `wait` seconds for an exit to show (a closed connection can come first)."""
        deadline = time.monotonic() + wait
        while True:
            for r, p in self.procs.items():
                code = p.poll()
                if code is not None:
                    return f"tensor-parallel rank {r} (pid {p.pid}) {_describe_exit(code)}"
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def wait(self) -> int:
        """Wait for every rank to exit; the first non-zero exit code, else 0."""
        codes = [p.wait() for p in self.procs.values()]
        return next((c for c in codes if c), 0)

    def stop(self, timeout: float = 10.0) -> None:
        """Wait up to `timeout` s for the ranks to exit (after a stop message), then end them."""
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_node(config: EngineConfig) -> int:
    """Run node `config.node_rank`'s ranks (node > 0 of a multi-node group) until rank 0 stops them."""
    layout = RankLayout.of(config)
    if config.dist_init_addr is None:
        raise ValueError("--dist-init-addr host:port of node 0 is needed to join it")
    print(f"radixgen: node {layout.node_rank} of {layout.nnodes} runs tensor-parallel ranks "
          f"{layout.ranks.start}..{layout.ranks.stop - 1}, joining {config.dist_init_addr}", flush=True)
    ranks = RankProcesses(config, config.dist_init_addr, layout.ranks)
    try:
        return ranks.wait()
    except KeyboardInterrupt:
        for p in ranks.procs.values():
            p.terminate()
        ranks.stop()
        return 130


def exit_with_parent(interval: float = 1.0) -> None:
    """End this process when the process that started it exits (a daemon thread polls the parent)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="radixgen-parent-watch", daemon=True).start()
