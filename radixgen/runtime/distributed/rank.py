"""A tensor-parallel rank other than 0: load this rank's shard, then run each step rank 0 broadcasts.

    python -m radixgen.runtime.distributed.rank --rank R --addr HOST:PORT --config '<EngineConfig JSON>'

Started by `launch.RankProcesses`; exits when rank 0 sends stop (0), or when rank 0 or another rank
goes away (1, with a line saying so), or when its launcher exits.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.distributed.group import TPGroup
from radixgen.runtime.distributed.launch import exit_with_parent, rank_config
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.layers.parallel import TensorParallel


def serve_rank(config: EngineConfig, rank: int, addr: str) -> int:
    """Join the group as `rank`, load, then follow rank 0's steps; the process exit code."""
    config = rank_config(config, rank)
    group = TPGroup(rank, config.tp_size, addr, torch.device(config.device))
    try:
        error = None
        try:
            runner = ModelRunner(config, TensorParallel(rank, config.tp_size, group))
        except Exception as e:  # reported to every rank by check_startup
            traceback.print_exc()
            error = f"{type(e).__name__}: {e}"
        group.check_startup(error)
        while (fb := group.recv_batch()) is not None:
            runner.forward(fb)
        return 0
    except RuntimeError as e:
        print(f"radixgen tensor-parallel rank {rank}: stopping after {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        group.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--config", required=True, help="EngineConfig fields as JSON")
    args = parser.parse_args(argv)
    exit_with_parent()
    sys.exit(serve_rank(EngineConfig(**json.loads(args.config)), args.rank, args.addr))


if __name__ == "__main__":
    main()
