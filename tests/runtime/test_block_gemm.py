"""The GGUF block kernel against the gguf package's own dequantization (float64 reference GEMM)."""

from __future__ import annotations

import threading

import gguf
import numpy as np
import pytest
import torch

from radixgen.runtime.kernels.block_gemm import (
    BLOCK_MAX_ROWS,
    WIDE_ROWS,
    block_linear,
    block_over_dense_time,
    block_rows_limit,
    concat_rows,
    from_gguf,
    library,
    pack_panels,
    use_blocks,
)

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler to build the block kernel")


def random_gguf(qtype: str, n: int, k: int, seed: int) -> np.ndarray:
    """Raw GGUF bytes [n, k/32 * block bytes] of random blocks with finite, varied fp16 scales."""
    rng = np.random.default_rng(seed)
    nb = k // 32
    scale = rng.uniform(-0.05, 0.05, (n, nb, 1)).astype(np.float16).view(np.uint8)  # [n, nb, 2]
    if qtype == "Q8_0":
        body = rng.integers(-128, 128, (n, nb, 32), dtype=np.int8).view(np.uint8)
        return np.concatenate([scale, body], -1).reshape(n, -1)
    nibbles = rng.integers(0, 256, (n, nb, 16), dtype=np.uint8)
    if qtype == "Q4_0":
        return np.concatenate([scale, nibbles], -1).reshape(n, -1)
    minv = rng.uniform(-0.2, 0.2, (n, nb, 1)).astype(np.float16).view(np.uint8)
    return np.concatenate([scale, minv, nibbles], -1).reshape(n, -1)


def gguf_dense(raw: np.ndarray, qtype: str, n: int, k: int) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(n, k).copy())


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 16, 17, 24, 40])
def test_block_linear_matches_gguf_dequantized(qtype, m):
    n, k = 37, 96  # three panels, the last one partial; three blocks per row
    raw = random_gguf(qtype, n, k, seed=m)
    w = from_gguf(raw, qtype)
    dense = gguf_dense(raw, qtype, n, k)
    assert torch.equal(w.dequantize(), dense)  # our reading of the bytes is gguf's, exactly
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    ref = x.double() @ dense.double().t()
    y = block_linear(x, pack_panels(w))
    assert y.shape == (m, n)
    assert (y.double() - ref).abs().max().item() <= 1e-5 * (1 + ref.abs().max().item())


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_block_linear_rows_do_not_depend_on_batch_mates(qtype):
    """Each output sums its products in one fixed order whatever the row count within a kernel path
    (the vector path below `block_gemm_amx_rows()` rows, the AMX tiles from there), so a row's result is
    bit-identical alone or among any others of its path (the 8-row groups, 16-row tiles, 128-row chunks
    and their remainders); across the two paths it agrees to float precision."""
    w = pack_panels(from_gguf(random_gguf(qtype, 50, 128, 7), qtype))
    x = torch.randn(140, 128, generator=torch.Generator().manual_seed(3))
    amx_rows = library().block_gemm_amx_rows()
    alone = torch.cat([block_linear(x[i : i + 1], w) for i in range(len(x))])
    wide = block_linear(x, w)
    for m in (2, 5, 9, 16, 17, 20, 40, 129, 140):
        y = block_linear(x[:m], w)
        assert torch.equal(y, alone[:m] if not amx_rows or m < amx_rows else wide[:m])
        torch.testing.assert_close(y, alone[:m], rtol=1e-5, atol=1e-5)


def test_rows_and_concat_keep_gguf_values():
    a_raw, b_raw = random_gguf("Q4_1", 8, 64, 1), random_gguf("Q4_0", 5, 64, 2)
    a, b = from_gguf(a_raw, "Q4_1"), from_gguf(b_raw, "Q4_0")
    both = concat_rows([a, b])
    expect = torch.cat([gguf_dense(a_raw, "Q4_1", 8, 64), gguf_dense(b_raw, "Q4_0", 5, 64)])
    assert torch.equal(both.dequantize(), expect)
    perm = torch.randperm(13)
    assert torch.equal(both.rows(perm).dequantize(), expect[perm])
    assert concat_rows([a, from_gguf(random_gguf("Q8_0", 4, 64, 3), "Q8_0")]) is None  # mixed bits


def test_bad_input_is_rejected():
    w = pack_panels(from_gguf(random_gguf("Q8_0", 4, 64, 0), "Q8_0"))
    with pytest.raises(ValueError, match="float32"):
        block_linear(torch.randn(2, 32), w)
    with pytest.raises(ValueError, match="float32"):
        block_linear(torch.randn(2, 64, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="Q6_K"):
        from_gguf(np.zeros((1, 210), np.uint8), "Q6_K")
    assert not use_blocks(torch.randn(4, 8, dtype=torch.bfloat16))


def test_zero_rows_on_a_fresh_thread():
    """An empty batch (a step with no row to sample) on a thread that never ran the kernel: the
    kernel's per-thread buffers are still empty, and 0 rows must still be a [0, n] answer."""
    w = pack_panels(from_gguf(random_gguf("Q4_0", 48, 64, 1), "Q4_0"))
    out: list = []
    t = threading.Thread(target=lambda: out.append(block_linear(torch.empty(0, 64), w)))
    t.start()
    t.join()
    assert out and out[0].shape == (0, 48)


def test_block_path_row_limit():
    """Any number of rows where AMX tiles take the wide ones; on the vector paths WIDE_ROWS where they
    compute about as fast as float32 FMAs (timed once at start-up), else BLOCK_MAX_ROWS."""
    amx = library().block_gemm_amx_rows() > 0
    limit = block_rows_limit()
    assert limit is None if amx else limit in (BLOCK_MAX_ROWS, WIDE_ROWS)
    assert use_blocks(torch.randn(BLOCK_MAX_ROWS, 8))
    assert use_blocks(torch.randn(2048, 8)) == amx
    if limit is not None:
        assert use_blocks(torch.randn(limit, 8)) and not use_blocks(torch.randn(limit + 1, 8))


def test_block_over_dense_time_times_both_sides():
    """The start-up probe returns a ratio of two measured times (positive, finite) for any row count."""
    for rows in (1, 9):
        ratio = block_over_dense_time(library(), rows=rows, reps=2)
        assert 0.0 < ratio < float("inf")


def test_smollm2_decodes_through_block_weights(smollm2_path):
    """The default model's every matrix gets a block copy (so its logits test covers the kernel)."""
    from radixgen.runtime.config import EngineConfig
    from radixgen.runtime.executor.model_runner import ModelRunner

    runner = ModelRunner(EngineConfig(max_total_tokens=64, max_running_requests=1))
    assert runner.model.block_weight_count == 4 * runner.model_config.num_layers + 1
    off = ModelRunner(EngineConfig(max_total_tokens=64, max_running_requests=1, disable_block_kernels=True))
    assert off.model.block_weight_count == 0
