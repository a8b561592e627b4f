"""How one step runs, decided once from its batch before the forward and passed down explicitly.

The worker asks the runner for the step's `StepPlan`: whether every layer runs in one C call (a pure
decode within the block kernel's rows, `kernels/decode_layers.py`), which rows take the matrices'
lower-precision wide GEMMs (the step's long extends, `layers/linear.py`), and whether the step's
torch ops run on this thread alone (see `ModelWorker`: a torch OpenMP team spinning between ops
starves the C kernels' threads where every matrix runs in C). The model reads the plan; nothing of it
lives in module state.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.runtime.executor.forward_batch import ForwardBatch
from radixgen.runtime.layers.linear import Runs, long_extend_runs
from radixgen.runtime.models.config import ModelConfig

# Attention's share of a step's multiply-adds up to which its torch ops run serially: prefill attention
# (torch SDPA) then runs on one thread, and the C kernels on all (SmolLM2 on 2 cores, serial / parallel
# prefill tok/s: 256 tokens (share 4%) 1052-1175 / 774-868, 512 (8%) 966-997 / 883-918, 1024 (14%)
# 831-890 / 962-974, 2048 (25%) 618 / 738-819).
SERIAL_ATTENTION_SHARE = 0.1


@dataclass(frozen=True)
class StepPlan:
    one_call: bool  # all layers in one C call, where the attention backend has a call for the step
    wide: Runs  # rows of long extends: the block matrices' wide GEMMs take them
    serial_torch: bool  # torch ops on one thread: every matrix of the step runs in C


def attention_share(fb: ForwardBatch, cfg: ModelConfig, torch_max_extend: int | None = None) -> float:
    """Attention's share of the step's multiply-adds (each query against its prefix and its own
    earlier keys; the matrices: q/k/v/o and the MLP per token), counting only the requests whose
    attention runs in torch: all, or (`torch_max_extend`) those extending by at most that many tokens
    (longer ones attend in the bfloat16 C kernel)."""
    cut = torch_max_extend if torch_max_extend is not None else float("inf")
    pairs = sum(e * p + e * (e + 1) // 2 for p, e in zip(fb.prefix_lens, fb.extend_lens, strict=True) if e <= cut)
    attention = 2 * pairs * cfg.num_heads * cfg.head_dim
    q_kv_o = cfg.hidden_size * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    matrices = sum(fb.extend_lens) * (q_kv_o + 3 * cfg.hidden_size * cfg.intermediate_size)
    return attention / (attention + matrices)


def plan_step(fb: ForwardBatch, cfg: ModelConfig, one_call_rows: int | None, long_extend_min: int | None,
              wide_in_c: bool = False, long_attention_in_c: bool = False) -> StepPlan:
    """The plan of step `fb` for a model whose one-call C decode takes up to `one_call_rows` rows (None:
    it has none) and whose block matrices give extends longer than `long_extend_min` to their wide path
    (None: wide inputs go there whole, past the block kernel's row limit), the block kernel itself where
    `wide_in_c` (fewer activation limbs), else GEMMs in torch. Every matrix runs in C where the model has
    the one-call path and the step's rows stay in the block kernel: all of them up to its limit, or,
    where long extends take the wide path, any step without one or any step at all where that path is
    in C. Their torch ops then run serially unless attention in torch is a large share of the step
    (long extends' attention is not, where it runs in C: `long_attention_in_c`)."""
    rows = sum(fb.extend_lens)
    wide = () if long_extend_min is None else long_extend_runs(fb.extend_lens, long_extend_min)
    if one_call_rows is None:
        in_c = False
    elif long_extend_min is not None:
        in_c = wide_in_c or not wide
    else:
        in_c = rows <= one_call_rows
    torch_max_extend = long_extend_min if long_attention_in_c else None
    serial = in_c and (fb.is_decode or attention_share(fb, cfg, torch_max_extend) <= SERIAL_ATTENTION_SHARE)
    return StepPlan(one_call=one_call_rows is not None and rows <= one_call_rows, wide=wide, serial_torch=serial)
