"""The Triton rotary + K/V store kernel against the torch path it replaces (`Rotary.apply` and
`TokenToKVPool.set_kv`): under the interpreter on CPU, compiled on CUDA when a GPU is present."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.kernels.triton_rope import rope_store
from radixgen.runtime.layers.rotary import Rotary

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 40), (8, 1, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_store_matches_the_torch_path(heads, kv_heads, head_dim, dtype):
    g = torch.Generator().manual_seed(heads * 1000 + head_dim)
    t, slots, max_len = 7, 40, 300
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    rotary = Rotary(inv_freq, max_len).to(DEVICE)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * head_dim, generator=g).to(DEVICE, dtype)
    positions = torch.randint(0, max_len, (t,), generator=g).to(DEVICE)
    loc = (torch.randperm(slots - 1, generator=g)[:t] + 1).to(DEVICE)  # scattered slots
    k_buf = torch.zeros(slots, kv_heads, head_dim, dtype=dtype, device=DEVICE)
    v_buf = torch.zeros_like(k_buf)

    q, k, v = qkv.float().split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    cos, sin = rotary.gather(positions, torch.float32)
    ref_q = Rotary.apply(q.view(t, heads, head_dim), cos, sin)  # float32 reference
    ref_k = Rotary.apply(k.reshape(t, kv_heads, head_dim), cos, sin)
    ref_k_buf, ref_v_buf = torch.zeros_like(k_buf, dtype=torch.float32), torch.zeros_like(v_buf, dtype=torch.float32)
    ref_k_buf[loc], ref_v_buf[loc] = ref_k, v.reshape(t, kv_heads, head_dim)

    untouched = qkv[:, heads * head_dim:].clone()
    rope_store(qkv, heads, kv_heads, rotary.cos, rotary.sin, positions, loc, k_buf, v_buf)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bfloat16: one rounding of the float32 result
    torch.testing.assert_close(qkv[:, : heads * head_dim].float().view(t, heads, head_dim), ref_q, atol=tol, rtol=tol)
    torch.testing.assert_close(k_buf.float(), ref_k_buf, atol=tol, rtol=tol)
    torch.testing.assert_close(v_buf.float(), ref_v_buf, atol=0.0, rtol=0.0)  # v is copied exactly
    assert torch.equal(qkv[:, heads * head_dim:], untouched)  # k and v are read, not rotated in place


def test_rope_store_rejects_a_mismatched_projection():
    qkv = torch.zeros(2, 5 * 64, device=DEVICE)
    buf = torch.zeros(4, 1, 64, device=DEVICE)
    idx = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match=r"not \[T, \(4 \+ 2 \* 1\) \* 64\]"):
        rope_store(qkv, 4, 1, torch.zeros(8, 32, device=DEVICE), torch.zeros(8, 32, device=DEVICE), idx, idx, buf, buf)
