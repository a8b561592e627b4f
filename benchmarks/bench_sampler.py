"""Sampler throughput: the torch path vs the fused Triton kernel (GPU) or vs the torch path with the
C steps the CPU worker hands it (bitmask, argmax, draw: `SamplerKernels`).

Configs: batch B in {1, 32, 256} x vocab V in {49152, 151936, 262144}, every row sampling with
temperature 0.7, top_k 50, top_p 0.9, min_p 0.05 (the kernel's full path: both threshold searches),
without and with a grammar bitmask (random words: all allowed, none, or mixed). Prints one JSON line
per config (median and min ms) and a summary line whose `ratio` is torch_ms / triton_ms on a GPU,
torch_ms / c_ms on CPU (medians, geometric mean over configs).
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

from radixgen.runtime.kernels import ffi  # noqa: E402
from radixgen.runtime.kernels.sampler_kernels import cpu_sampler_kernels  # noqa: E402
from radixgen.sampling import SamplingBatch, SamplingParams, sample  # noqa: E402

BATCHES = (1, 32, 256)
VOCABS = (49152, 151936, 262144)
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
    peer, peer_name = None, None
    if device.type == "cuda":
        from radixgen.sampling.triton_kernels import triton_sample

        peer, peer_name = triton_sample, "triton"
    elif ffi.library() is not None:
        peer, peer_name = partial(sample, kernels=cpu_sampler_kernels()), "c"
    gen = torch.Generator(device=device).manual_seed(0)
    ratios = []
    for V in VOCABS:
        for B in BATCHES:
            logits = torch.randn(B, V, generator=gen, device=device) * 3  # [B, V]
            params = [SamplingParams(**PARAMS, seed=i) for i in range(B)]
            batch = SamplingBatch.build(params, [[1, 2, 3]] * B, list(range(B)), V, [2], device)
            words = torch.randint(-(2**31), 2**31, (B, (V + 31) // 32), generator=gen, device=device,
                                  dtype=torch.int64).to(torch.int32)  # [B, W]: mixed words...
            kind = torch.randint(0, 3, words.shape, generator=gen, device=device)
            words[kind == 0], words[kind == 1] = -1, 0  # ...and words of all allowed or none
            for bitmask in (None, words):
                budget = 0.5 if device.type == "cpu" else 1.0
                torch_ms, torch_min = time_ms(partial(sample, logits, batch, bitmask), device, budget)
                row = {"bench": "sampler", "device": device.type, "threads": torch.get_num_threads(), "B": B,
                       "V": V, "params": PARAMS, "bitmask": bitmask is not None, "torch_ms": round(torch_ms, 3),
                       "torch_min_ms": round(torch_min, 3), "peer": peer_name, "peer_ms": None, "ratio": None}
                if peer is not None:
                    peer_ms, peer_min = time_ms(partial(peer, logits, batch, bitmask), device, budget)
                    row["peer_ms"], row["peer_min_ms"] = round(peer_ms, 3), round(peer_min, 3)
                    row["ratio"] = round(torch_ms / peer_ms, 3)
                    ratios.append(torch_ms / peer_ms)
                print(json.dumps(row), flush=True)
    summary = {"bench": "sampler", "summary": True, "device": device.type,
               "metric": f"torch_ms / {peer_name}_ms (geometric mean over configs)",
               "ratio": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3) if ratios else None}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
