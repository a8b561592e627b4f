"""The CPU sampler's C stand-ins, bundled as the torch sampler takes them (`SamplerKernels`): the grammar
bitmask (`token_bitmask.py`), greedy argmax (`argmax.py`) and seeded draw (`sample_draw.py`)."""

from __future__ import annotations

from radixgen.runtime.kernels.argmax import argmax_rows
from radixgen.runtime.kernels.sample_draw import draw_rows
from radixgen.runtime.kernels.token_bitmask import apply_bitmask
from radixgen.sampling.torch_ops import SamplerKernels


def cpu_sampler_kernels() -> SamplerKernels:
    """The kernels the worker hands the torch sampler on CPU (each falls back to torch where the C
    library is missing or the tensors are not its kind)."""
    return SamplerKernels(argmax=argmax_rows, draw=draw_rows, apply_mask=apply_bitmask)
