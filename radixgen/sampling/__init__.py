"""Sampling: per-request parameters, the batched torch sampler, and the fused Triton kernel.

The Triton module is not imported here (it is loaded lazily by `Sampler` when selected).
"""

from radixgen.sampling.params import SamplingParams
from radixgen.sampling.sampler import Sampler
from radixgen.sampling.torch_ops import (
    SampleOutput,
    SamplingBatch,
    apply_token_bitmask_,
    counter_uniform,
    sample,
)

__all__ = [
    "SampleOutput",
    "Sampler",
    "SamplingBatch",
    "SamplingParams",
    "apply_token_bitmask_",
    "counter_uniform",
    "sample",
]
