"""The C bitmask of the CPU sampler (`kernels/token_bitmask.py`) against the torch sampler's own
(`torch_ops.apply_token_bitmask_`): words of all-allowed, all-banned and mixed tokens, vocabularies not
a multiple of 32, masks wider than the vocabulary needs; its SIMD and scalar builds."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.kernels import ffi
from radixgen.runtime.kernels.token_bitmask import apply_bitmask
from radixgen.sampling.torch_ops import apply_token_bitmask_

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the kernels")


@pytest.mark.parametrize("rows,vocab,extra_words", [(1, 262144, 0), (3, 49152 + 17, 0), (2, 100, 3), (4, 31, 0)])
def test_bitmask_matches_torch(kernel_build, rows, vocab, extra_words):
    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32 + extra_words
    bits = torch.randint(-(2**31), 2**31, (rows, words), generator=g, dtype=torch.int64).to(torch.int32)  # mixed
    kind = torch.randint(0, 3, (rows, words), generator=g)
    bits[kind == 0] = -1  # every token of the word allowed
    bits[kind == 1] = 0  # none
    logits = torch.randn(rows, vocab, generator=g)
    want = apply_token_bitmask_(logits.clone(), bits)
    assert torch.equal(apply_bitmask(logits.clone(), bits, kernel_build), want)


def test_bad_masks_are_refused():
    with pytest.raises(ValueError, match="int32"):
        apply_bitmask(torch.zeros(2, 100), torch.zeros(2, 3, dtype=torch.int32))  # 96 bits for 100 tokens
