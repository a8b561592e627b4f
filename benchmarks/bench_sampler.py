"""Sampler throughput: the torch path vs the fused Triton kernel.

Configs: batch B in {1, 32, 256} x vocab V in {49152, 151936}, every row sampling with
temperature 0.7, top_k 50, top_p 0.9, min_p 0.05 (the kernel's full path: both threshold searches).
Prints one JSON line per config (median and min ms) and a summary line whose `ratio` is
torch_ms / triton_ms (medians, geometric mean over configs). On CPU only the torch path is timed
and the GPU figure is reported as pending.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from functools import partial
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


if __name__ == "__main__":
    build_parser().parse_args()  # --help and bad flags answer before torch is imported

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixgen.sampling import SamplingBatch, SamplingParams, sample  # noqa: E402

BATCHES = (1, 32, 256)
VOCABS = (49152, 151936)
PARAMS = dict(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device: torch.device, budget_s: float, max_iters: int = 50) -> tuple[float, float]:
    """(median, min) wall time of fn() in ms after one warm-up call, within about budget_s seconds.
    The min is reported too: on a loaded 2-core box torch's thread pool makes the median noisy."""
    fn()
    _sync(device)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_iters and (len(times) < 3 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def main() -> None:
    build_parser().parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    triton_sample = None
    if device.type == "cuda":
        from radixgen.sampling.triton_kernels import triton_sample
    gen = torch.Generator(device=device).manual_seed(0)
    ratios = []
    for V in VOCABS:
        for B in BATCHES:
            logits = torch.randn(B, V, generator=gen, device=device) * 3  # [B, V]
            params = [SamplingParams(**PARAMS, seed=i) for i in range(B)]
            batch = SamplingBatch.build(params, [[1, 2, 3]] * B, list(range(B)), V, [2], device)
            budget = 0.5 if device.type == "cpu" else 1.0
            torch_ms, torch_min = time_ms(partial(sample, logits, batch), device, budget)
            row = {"bench": "sampler", "device": device.type, "threads": torch.get_num_threads(), "B": B,
                   "V": V, "params": PARAMS, "torch_ms": round(torch_ms, 3), "torch_min_ms": round(torch_min, 3),
                   "triton_ms": None, "ratio": None}
            if triton_sample is not None:
                triton_ms, triton_min = time_ms(partial(triton_sample, logits, batch), device, budget)
                row["triton_ms"], row["triton_min_ms"] = round(triton_ms, 3), round(triton_min, 3)
                row["ratio"] = round(torch_ms / triton_ms, 3)
                ratios.append(torch_ms / triton_ms)
            else:
                row["note"] = "no GPU: Triton figure pending"
            print(json.dumps(row), flush=True)
    summary = {"bench": "sampler", "summary": True, "device": device.type,
               "metric": "torch_ms / triton_ms (geometric mean over configs)",
               "ratio": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3) if ratios else None}
    if not ratios:
        summary["note"] = "torch path timed on CPU; the GPU (Triton) figure is pending"
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
