"""A mixture-of-experts MLP as Qwen3-MoE defines it (HF `Qwen3MoeSparseMoeBlock`; llama.cpp's
`build_moe_ffn` with softmax gating).

A router (a [num_experts, hidden] linear) scores each token; the softmax of those scores, in float32,
picks the token's top-k experts, whose probabilities (renormalized to sum to 1 where the config says
`norm_topk_prob`) weight the experts' SwiGLU outputs in the sum. Each expert keeps its own gate/up and
down matrices in whatever representation the loader gives them (GGUF blocks: one BlockWeight per
expert, rows of the file's stacked tensor). A step's (token, slot) pairs are grouped by expert, so each
chosen expert runs one GEMM over all its tokens, and an expert no token chose is never read: a decode
step touches only its tokens' top-k experts' weights.

Under tensor parallelism (SGLang's default MoE tensor parallelism) every rank holds every expert, each
over its slice of the expert width (`sharding.ShardPlan.expert_rows`: rows of gate/up, columns of down),
and the replicated router on the replicated input routes alike on every rank; each rank's weighted sum
is then a partial sum of the layer's output, all-reduced once per layer (not once per expert).
"""

from __future__ import annotations

import torch
from torch import nn

from radixgen.runtime.layers.linear import DenseLinear, Linear, Runs
from radixgen.runtime.layers.norm import SiluAndMul
from radixgen.runtime.layers.parallel import TensorParallel


class Expert(nn.Module):
    """One expert: a SwiGLU MLP with its gate and up rows fused (`gate_up`), sharing its MoE's `act`;
    `inter` is its width on this rank (all of it on one rank)."""

    def __init__(self, hidden: int, inter: int, act: SiluAndMul) -> None:
        super().__init__()
        self.gate_up: Linear = DenseLinear(hidden, 2 * inter)
        self.down: Linear = DenseLinear(inter, hidden)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, hidden] (the tokens routed here) -> [n, hidden]."""
        return self.down(self.act(self.gate_up(x)))


class MoEMLP(nn.Module):
    """A sparse MLP: `router` (HF `mlp.gate`) and `experts` (HF `mlp.experts.E`, each `inter` wide on this
    rank), top-`top_k` routing; under tensor parallelism (`tp`) the output is summed over the ranks."""

    def __init__(self, hidden: int, inter: int, num_experts: int, top_k: int, norm_topk_prob: bool,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.router: Linear = DenseLinear(hidden, num_experts)
        self.act = SiluAndMul()  # one module for every expert (the C kernels are switched on once)
        self.experts = nn.ModuleList(Expert(hidden, inter, self.act) for _ in range(num_experts))
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's routing weights [T, top_k] (x's dtype) and chosen experts [T, top_k] (int64), in
        descending order of probability, exactly as HF's `Qwen3MoeTopKRouter` computes them."""
        probs = torch.softmax(self.router(x), dim=-1, dtype=torch.float32)  # [T, E]
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # [T, k] each
        if self.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), chosen

    def forward(self, x: torch.Tensor, wide: Runs = ()) -> torch.Tensor:
        """x [T, hidden] -> the routing-weighted sum of each token's experts' outputs [T, hidden] (under
        tensor parallelism: this rank's partial sums, then one all-reduce). `wide` (the step's
        long-extend rows) does not apply to the regrouped rows: expert matrices take their rows as any
        input."""
        weights, chosen = self.route(x)  # [T, k] each
        flat = chosen.reshape(-1)  # [T * k] the expert of each (token, slot) pair
        order = flat.argsort(stable=True)  # pairs grouped by expert, in token order inside each group
        tokens = order // self.top_k  # [T * k] the token of each grouped pair
        scale = weights.reshape(-1, 1)[order]  # [T * k, 1]
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        out = torch.zeros_like(x)  # [T, hidden]
        start = 0
        for expert, n in zip(self.experts, counts, strict=True):
            if n:
                rows = tokens[start : start + n]  # [n]
                y = expert(x.index_select(0, rows))  # [n, hidden]
                out.index_add_(0, rows, y.mul_(scale[start : start + n]))
            start += n
        return out if self.tp is None else self.tp.comm.all_reduce(out)
