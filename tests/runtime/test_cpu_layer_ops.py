"""The fused C layer ops against the torch formulas they replace (float32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixgen.radix_cache import kv_quant
from radixgen.runtime.kernels import ffi
from radixgen.runtime.kernels import layer_ops as cpu_layer_ops
from radixgen.runtime.layers.rotary import Rotary

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the kernels")


@pytest.mark.parametrize("t,n", [(1, 576), (5, 64), (3, 100), (200, 512)])  # 200 x 512: the threaded path
def test_add_rms_norm(t, n):
    g = torch.Generator().manual_seed(t * n)
    h, delta = (torch.randn(t, n, generator=g) * 3 for _ in range(2))
    w = torch.randn(n, generator=g)
    expect_h = h + delta
    expect = F.rms_norm(expect_h, (n,), w, 1e-5)
    h_plain = h.clone()
    torch.testing.assert_close(cpu_layer_ops.add_rms_norm(h_plain, w, 1e-5), F.rms_norm(h, (n,), w, 1e-5))
    assert torch.equal(h_plain, h)  # no delta: h untouched
    out = cpu_layer_ops.add_rms_norm(h, w, 1e-5, delta=delta)
    assert torch.equal(h, expect_h)
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t,inter", [(1, 1536), (4, 20), (64, 1536)])
def test_silu_mul(t, inter):
    gu = torch.randn(t, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 6
    gu[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -87.5])  # saturated ends of the sigmoid
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_layer_ops.silu_mul(gu), F.silu(gate) * up, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("t,inter", [(1, 2048), (4, 20), (64, 1536)])
def test_gelu_mul(t, inter):
    gu = torch.randn(t, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 4
    gu[0, :6] = torch.tensor([-100.0, 100.0, 0.0, -87.5, 1e-3, -5.0])  # saturated ends of the tanh, near 0
    gate, up = gu.double().chunk(2, dim=-1)
    expect = (F.gelu(gate, approximate="tanh") * up).float()  # float64 math: float32's 1 + tanh(y) loses x < -4
    torch.testing.assert_close(cpu_layer_ops.gelu_mul(gu), expect, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 32), (6, 2, 80)])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store(heads, kv_heads, head_dim, qk_norm):
    from radixgen.runtime.models.config import ModelConfig

    cfg = ModelConfig(arch="llama", vocab_size=10, hidden_size=heads * head_dim, intermediate_size=8, num_layers=1,
                      num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-5,
                      rope_theta=10000.0, max_position_embeddings=512)
    rot = Rotary(cfg.inv_freq(), 512)
    g = torch.Generator().manual_seed(heads)
    t = 7
    qkv = torch.randn(t, (heads + 2 * kv_heads) * head_dim, generator=g)
    positions = torch.tensor([0, 1, 5, 100, 511, 3, 3])
    loc = torch.randperm(40, generator=g)[:t] + 1
    k_buf, v_buf = torch.zeros(41, kv_heads, head_dim), torch.zeros(41, kv_heads, head_dim)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    q, k = q.reshape(t, heads, head_dim), k.reshape(t, kv_heads, head_dim)
    norms = {}
    if qk_norm:  # Qwen3 / Gemma 3: per-head RMSNorm before the rotary
        norms = {"q_norm": torch.rand(head_dim, generator=g) + 0.5, "k_norm": torch.rand(head_dim, generator=g) + 0.5,
                 "eps": 1e-6}
        q = F.rms_norm(q, (head_dim,), norms["q_norm"], 1e-6)
        k = F.rms_norm(k, (head_dim,), norms["k_norm"], 1e-6)
    cos, sin = rot.gather(positions, torch.float32)
    q_ref = rot.apply(q, cos, sin)
    k_ref = rot.apply(k, cos, sin)
    v_ref = v.reshape(t, kv_heads, head_dim).clone()
    cpu_layer_ops.rope_store(qkv, heads, kv_heads, rot.cos, rot.sin, positions, loc, k_buf, v_buf, **norms)
    torch.testing.assert_close(qkv[:, : heads * head_dim].view(t, heads, head_dim), q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_buf[loc], k_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(v_buf[loc], v_ref)
    untouched = torch.ones(41, dtype=torch.bool)
    untouched[loc] = False
    assert not k_buf[untouched].any() and not v_buf[untouched].any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rope_store_rounds_like_torch(dtype):
    """A 16-bit KV cache: v is stored exactly as torch rounds it to that dtype (nearest even, float16's
    subnormals and overflow included), so the C and torch paths fill the cache alike."""
    kv_heads, d, t = 2, 64, 3
    g = torch.Generator().manual_seed(0)
    v = torch.randn(t, kv_heads * d, generator=g) * torch.pow(10.0, torch.empty(t, kv_heads * d).uniform_(-9, 6,
                                                                                                          generator=g))
    ties = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.0, 65520.0, 2**-25, 3 * 2**-26,
            1.5 * 2**-24, 2**-14 * (1 - 2**-11), -0.0, 1e-40, float("inf"), -float("inf"), -3e38]
    v[0, : len(ties)] = torch.tensor(ties)
    qkv = torch.cat([torch.zeros(t, 2 * kv_heads * d), v], 1)  # one query head per KV head, then k (0), then v
    cos, sin = torch.ones(8, d // 2), torch.zeros(8, d // 2)
    k_buf, v_buf = torch.zeros(5, kv_heads, d, dtype=dtype), torch.zeros(5, kv_heads, d, dtype=dtype)
    loc = torch.tensor([3, 1, 4])
    cpu_layer_ops.rope_store(qkv, kv_heads, kv_heads, cos, sin, torch.tensor([0, 1, 2]), loc, k_buf, v_buf)
    expect = v.to(dtype).view(t, kv_heads, d)
    assert torch.equal(v_buf[loc].view(torch.int16), expect.view(torch.int16))


def test_rope_store_quantizes_like_kv_quant():
    """An int8 KV cache: the C store writes exactly kv_quant.quantize's rows (values and scale bytes)."""
    kv_heads, d, t = 3, 64, 4
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(t, 3 * kv_heads * d, generator=g) * 5
    qkv[1, 2 * kv_heads * d : 2 * kv_heads * d + d] = 0  # an all-zero v head row: scale 0
    cos, sin = torch.ones(8, d // 2), torch.zeros(8, d // 2)  # no rotation: k is stored as given
    k_buf, v_buf = torch.zeros(6, kv_heads, d + 4, dtype=torch.int8), torch.zeros(6, kv_heads, d + 4, dtype=torch.int8)
    loc = torch.tensor([5, 1, 3, 2])
    cpu_layer_ops.rope_store(qkv, kv_heads, kv_heads, cos, sin, torch.arange(t), loc, k_buf, v_buf)
    k, v = qkv[:, kv_heads * d : 2 * kv_heads * d], qkv[:, 2 * kv_heads * d :]
    assert torch.equal(k_buf[loc], kv_quant.quantize(k.reshape(t, kv_heads, d)))
    assert torch.equal(v_buf[loc], kv_quant.quantize(v.reshape(t, kv_heads, d)))


def test_rejects_non_contiguous():
    with pytest.raises(ValueError, match="contiguous"):
        cpu_layer_ops.silu_mul(torch.randn(8, 4).t())
