"""All layers of a decode step in one C call (`fused_decode`) against the per-op path it replaces.

Both run the same kernels in the same order, so logits and the K/V written must be bitwise equal;
the per-op path itself is checked against HF transformers in test_model_logits.py. Covered: plain
decodes of different lengths, and decodes that share a cached prefix (the cascade attention).
"""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.forward_batch import make_forward_batch
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.kernels import ffi

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the kernels")


@pytest.fixture(scope="module")
def runner(smollm2_path) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(smollm2_path), max_total_tokens=4096, max_running_requests=16))


def _prefill(runner: ModelRunner, prompts: list[list[int]], shared: int) -> list[tuple[int, list[int]]]:
    """Prefill each prompt in its own request slot; the first `shared` tokens of every prompt use the
    KV slots of the first prompt's (as the radix cache hands out a cached prefix). Returns (slot, tokens)."""
    pool, kv = runner.req_to_token_pool, runner.token_to_kv_pool
    seqs = []
    for i, ids in enumerate(prompts):
        slot = pool.alloc()
        reuse = shared if i > 0 else 0
        if reuse:
            pool.write(slot, 0, pool.req_to_token[seqs[0][0], :reuse].clone())
        loc = kv.alloc(len(ids) - reuse)
        pool.write(slot, reuse, loc)
        runner.forward(make_forward_batch([ids[reuse:]], [reuse], [slot], loc, table_update=pool.take_updates()))
        seqs.append((slot, list(ids)))
    return seqs


def _decode_step(runner: ModelRunner, seqs: list[tuple[int, list[int]]], tokens: list[int],
                 loc: torch.Tensor) -> torch.Tensor:
    pool = runner.req_to_token_pool
    for (slot, ids), slot_kv in zip(seqs, loc, strict=True):
        pool.write(slot, len(ids), slot_kv.view(1))
    fb = make_forward_batch([[t] for t in tokens], [len(ids) for _, ids in seqs], [s for s, _ in seqs], loc,
                            table_update=pool.take_updates())
    return runner.forward(fb)  # [B, V]


@pytest.mark.parametrize("shared", [0, 80])  # 80: every request starts with the same 80 KV slots (cascade)
def test_fused_decode_equals_per_op_path(runner, shared):
    model, kv = runner.model, runner.token_to_kv_pool
    fused_decode = model.decode_in_c
    assert fused_decode is not None
    g = torch.Generator().manual_seed(shared)
    prefix = torch.randint(100, 40000, (shared,), generator=g).tolist()
    prompts = [prefix + torch.randint(100, 40000, (n,), generator=g).tolist() for n in (5, 17, 3, 40, 9)]
    seqs = _prefill(runner, prompts, shared)
    tokens = [int(t) for t in torch.randint(100, 40000, (len(seqs),), generator=g)]
    for _ in range(3):
        loc = kv.alloc(len(seqs))
        model.decode_in_c = None  # the per-op path (each layer still runs its fused C ops)
        per_op = _decode_step(runner, seqs, tokens, loc)
        k_per_op = [kv.k_buffer[i][loc].clone() for i in (0, len(model.layers) - 1)]
        model.decode_in_c = fused_decode
        fused = _decode_step(runner, seqs, tokens, loc)  # rewrites the same slots
        assert torch.equal(fused, per_op)
        for i, k in zip((0, len(model.layers) - 1), k_per_op, strict=True):
            assert torch.equal(kv.k_buffer[i][loc], k)
        for s, t in zip(seqs, tokens, strict=True):
            s[1].append(t)
        tokens = fused.argmax(-1).tolist()
