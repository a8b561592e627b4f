"""The KV pool's size from mem_fraction_static (SGLang's rule) and the refusals that name the numbers,
checked before the weights are read."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.memory_plan import GIB, available_memory, kv_bytes_per_token, plan_kv
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.models.loader import open_checkpoint


def test_pool_is_the_fraction_less_the_weights():
    plan = plan_kv(10 * GIB, 2 * GIB, 1024, 0.5, None, 1 << 40, "m")
    assert plan.kv_tokens == (5 * GIB - 2 * GIB) // 1024
    assert plan_kv(10 * GIB, 2 * GIB, 1024, 0.5, None, 5000, "m").kv_tokens == 5000  # no more than slots can use
    assert plan_kv(10 * GIB, 2 * GIB, 1024, 0.5, 777, 5000, "m").kv_tokens == 777  # an explicit size wins


def test_refusals_name_the_numbers():
    with pytest.raises(ValueError, match=r"m does not fit: its weights take about 12.00 GiB and 10.00 GiB"):
        plan_kv(10 * GIB, 12 * GIB, 1024, 0.9, None, 1 << 40, "m")
    with pytest.raises(ValueError, match=r"max_total_tokens=9000000 needs about 10.58 GiB"):
        plan_kv(10 * GIB, 2 * GIB, 1024, 0.9, 9_000_000, 1 << 40, "m")
    with pytest.raises(ValueError, match=r"mem_fraction_static=0.1 .* under 16 tokens"):
        plan_kv(10 * GIB, 2 * GIB, 1024, 0.1, None, 1 << 40, "m")


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(30, 3, 64, torch.float32) == 2 * 30 * 3 * 64 * 4
    assert kv_bytes_per_token(30, 3, 64, torch.int8) == 2 * 30 * 3 * (64 + 4)


def test_engine_pool_follows_the_fraction(smollm2_path):
    """SmolLM2 from its GGUF: the weights are estimated in the block kernel's bytes (near the file, far
    from a float32 copy) and the pool is what the fraction leaves, capped at every slot's full context."""
    config, ckpt = open_checkpoint(smollm2_path)
    blocks = ckpt.resident_bytes(True, torch.float32)
    assert 0.9 * smollm2_path.stat().st_size < blocks < 1.4 * smollm2_path.stat().st_size
    assert ckpt.resident_bytes(False, torch.float32) > 4 * blocks
    runner = ModelRunner(EngineConfig(max_running_requests=2, context_length=1024, mem_fraction_static=0.9))
    assert runner.token_to_kv_pool.size == 2 * 1024  # the slots' cap, far below 90% of memory
    with pytest.raises(ValueError, match="mem_fraction_static=1e-06"):
        ModelRunner(EngineConfig(mem_fraction_static=1e-6))
    with pytest.raises(ValueError, match="lower max_total_tokens"):
        ModelRunner(EngineConfig(max_total_tokens=available_memory(torch.device("cpu")) // 1000))
