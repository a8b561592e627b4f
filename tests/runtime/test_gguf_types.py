"""Every GGUF type a user's file may hold, end to end: a tiny random Llama GGUF per type (and the mixes
real files have) runs in radixgen from its blocks, with logits equal to HF transformers' on the same
file (HF dequantizes it with gguf-py) within the float32 tolerance of test_model_logits."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.model_runner import ModelRunner
from radixgen.runtime.kernels import ffi
from radixgen.runtime.kernels.block_gemm import WIDE_ROWS
from radixgen.runtime.layers.linear import BlockLinear, ConcatLinear, StoredLinear
from tests.runtime.gguf_models import LAYERS, write_tiny_gguf
from tests.runtime.test_model_logits import check_model

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the block kernels")

BLOCK_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
PROMPT_IDS = list(range(3, 60, 2))
# Q4_K_M as llama-quantize mixes it: Q4_K, with Q6_K for attn_v, ffn_down and the head
Q4_K_M = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"}
# Gemma 3 270M's file mixes Q5_0, Q8_0, Q4_K and Q6_K; q/k signed beside an unsigned v fuse in no format
SIGNED_BESIDE_UNSIGNED = {"attn_q": "Q5_0", "attn_k": "Q8_0", "attn_v": "Q6_K", "ffn_gate": "Q4_K", "ffn_up": "Q5_0",
                          "token_embd": "Q6_K", "output": "Q8_0"}


def _runner(path) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(path), max_total_tokens=1024, max_running_requests=2))


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_block_type_matches_hf(tmp_path, qtype):
    path = write_tiny_gguf(tmp_path / f"{qtype}.gguf", {}, qtype)
    model = _runner(path).model
    assert model.block_weight_count == 4 * LAYERS + 1  # every matrix and the head on the blocks
    assert model.decode_in_c is not None  # and the one-call C decode step
    check_model(path, PROMPT_IDS)


@pytest.mark.parametrize("qtype", ["F16", "BF16", "F32"])
def test_float_type_matches_hf(tmp_path, qtype):
    path = write_tiny_gguf(tmp_path / f"{qtype}.gguf", {}, qtype)
    stored = sum(isinstance(m, StoredLinear) for m in _runner(path).model.modules())
    assert stored == (0 if qtype == "F32" else 4 * LAYERS + 1)  # 16-bit matrices stay 16-bit
    check_model(path, PROMPT_IDS)


def test_q4_k_m_mix_matches_hf(tmp_path):
    """Q4_K q/k beside a Q6_K v fuse into one 8-bit matrix; the layer still decodes in one C call. A
    prompt past the block kernel's row limit multiplies float32 slices dequantized from the blocks."""
    path = write_tiny_gguf(tmp_path / "q4_k_m.gguf", Q4_K_M, "Q4_K")
    model = _runner(path).model
    assert model.block_weight_count == 4 * LAYERS + 1 and model.decode_in_c is not None
    check_model(path, PROMPT_IDS)
    long_ids = [(7 * i) % 380 + 3 for i in range(WIDE_ROWS + 50)]
    check_model(path, long_ids, wide_matmul_dtype="float32")


def test_mixed_signs_and_tied_head_match_hf(tmp_path):
    """Matrices no one block format holds run side by side; a tied head reads the embedding's blocks."""
    path = write_tiny_gguf(tmp_path / "mixed.gguf", SIGNED_BESIDE_UNSIGNED, "Q4_1", tied=True)
    model = _runner(path).model
    assert any(isinstance(m, ConcatLinear) for m in model.modules())
    assert isinstance(model.lm_head, BlockLinear) and model.lm_head.panels is model.embed
    check_model(path, PROMPT_IDS)


def test_disabled_block_kernels_run_dense(tmp_path):
    """`disable_block_kernels` dequantizes to plain float32 matrices (no blocks), same logits."""
    path = write_tiny_gguf(tmp_path / "q4_k.gguf", {}, "Q4_K")
    runner = ModelRunner(EngineConfig(model=str(path), max_total_tokens=256, max_running_requests=1,
                                      disable_block_kernels=True))
    assert runner.model.block_weight_count == 0
    blocks = _runner(path)
    ids = torch.tensor(PROMPT_IDS)
    from tests.runtime.test_model_logits import Seq

    torch.testing.assert_close(Seq(runner).extend(ids.tolist(), all_logits=True),
                               Seq(blocks).extend(ids.tolist(), all_logits=True), atol=2e-3, rtol=0)


def test_bad_files_are_refused_with_what_is_wrong(tmp_path):
    """A type no kernel reads, a truncated file and a file that is no GGUF: each a ValueError naming
    the file and the problem, raised before any weight is read."""
    import gguf
    import numpy as np

    path = write_tiny_gguf(tmp_path / "ok.gguf", {}, "Q4_0")
    writer = gguf.GGUFWriter(tmp_path / "iq.gguf", "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 18 * 8), np.uint8), raw_dtype=gguf.GGMLQuantizationType.IQ4_NL)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    from radixgen.runtime.models.gguf_arch import gguf_config
    from radixgen.runtime.models.gguf_file import read_header
    from radixgen.runtime.models.loader import GGUFCheckpoint

    header = read_header(tmp_path / "iq.gguf")
    ok = read_header(path)
    with pytest.raises(ValueError, match=r"unsupported GGUF type IQ4_NL in tensor 'token_embd.weight' of iq.gguf"):
        GGUFCheckpoint(tmp_path / "iq.gguf", header, gguf_config(ok))
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(ValueError, match="cut.gguf ends inside tensor"):
        _runner(truncated)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model" * 10)
    with pytest.raises(ValueError, match="junk.gguf is not a GGUF file"):
        _runner(junk)
