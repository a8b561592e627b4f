"""Rotary position embeddings (HF's rotate-half layout), tables for every position up to max_len.

The tables are sized to the positions a served sequence can reach (the context length, or fewer where
the KV pool holds fewer tokens), not to the model's maximum: Gemma 3's two 32k-position tables of
128 frequencies are 67 MB, a quarter of its 270M model's weights."""

from __future__ import annotations

import torch
from torch import nn


class Rotary(nn.Module):
    """cos/sin tables [P, D/2] (float32) for all positions, multiplied by `scale` (LongRoPE's attention
    factor, which every kernel reading the tables then applies); `gather` once per step, `apply` per layer."""

    def __init__(self, inv_freq: torch.Tensor, max_len: int, scale: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)  # [D/2]
        self.scale = scale
        self.resize(max_len)

    def resize(self, max_len: int) -> None:
        """Rebuild the tables for positions 0..max_len-1 (float32, on inv_freq's device)."""
        positions = torch.arange(max_len, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(positions, self.inv_freq)  # [P, D/2]
        cos, sin = freqs.cos(), freqs.sin()
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def gather(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, D/2] of `positions` [T]."""
        cos = self.cos.index_select(0, positions).unsqueeze(1).to(dtype)
        sin = self.sin.index_select(0, positions).unsqueeze(1).to(dtype)
        return cos, sin

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, H, D]; cos/sin: [T, 1, D/2]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
