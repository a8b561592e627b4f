"""All layers of a decode step in one C call (`fused_decode`) against the per-op path it replaces.

Both run the same kernels in the same order, so logits and the K/V written must be bitwise equal;
the per-op path itself is checked against HF transformers in test_model_logits.py and test_gemma3.py.
Covered: plain decodes of different lengths, and decodes that share a cached prefix (the cascade
attention), on SmolLM2 and on a tiny Gemma 3 GGUF in the 270M file's quant mix (q/k norms, norms on
the attention's and MLP's outputs, GeGLU, sliding-window layers with their own rotary table, every
request past the 16-token window in some steps, not in others).
"""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.forward_batch import make_forward_batch
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.kernels import ffi

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the kernels")


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def runner(request, tmp_path_factory) -> ModelRunner:
    if request.param == "smollm2":
        path = request.getfixturevalue("smollm2_path")
    else:
        from tests.runtime.gguf_models import write_tiny_gemma3_gguf
        from tests.runtime.test_gemma3 import Q4_K_M_MIX

        path = write_tiny_gemma3_gguf(tmp_path_factory.mktemp("gemma3") / "gemma3.gguf", Q4_K_M_MIX, "Q5_0")
    return ModelRunner(EngineConfig(model=str(path), max_total_tokens=4096, max_running_requests=16))


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


# shared 80: every request starts with the same 80 KV slots (the cascade); short prompts stay within the window
@pytest.mark.parametrize("shared,lengths", [(0, (5, 17, 3, 40, 9)), (80, (5, 17, 3, 40, 9)), (0, (5, 3, 9, 2, 7))])
def test_fused_decode_equals_per_op_path(runner, shared, lengths, monkeypatch):
    model, kv = runner.model, runner.token_to_kv_pool
    fused_decode = model.decode_in_c
    assert fused_decode is not None
    calls = []  # the C step's calls, so the comparison cannot pass by both sides taking the per-op path
    monkeypatch.setattr(fused_decode, "run", lambda *a, **k: calls.append(1) or type(fused_decode).run(
        fused_decode, *a, **k))
    if model.window is not None:  # Gemma 3: the C step's layers are Gemma's, some of them windowed
        assert any(w.local for w in fused_decode.layers) and all(w.gelu and w.q_norm is not None
                                                                 for w in fused_decode.layers)
    g = torch.Generator().manual_seed(shared)
    top = min(40000, model.config.vocab_size)
    prefix = torch.randint(100, top, (shared,), generator=g).tolist()
    prompts = [prefix + torch.randint(100, top, (n,), generator=g).tolist() for n in lengths]
    seqs = _prefill(runner, prompts, shared)
    tokens = [int(t) for t in torch.randint(100, top, (len(seqs),), generator=g)]
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
    assert len(calls) == 3
