"""Which part of each weight a tensor-parallel rank holds (Megatron-style sharding of a Llama-family model).

With `size` ranks, rank r holds:
- query heads r*H/size .. (r+1)*H/size (rows of q_proj, columns of o_proj);
- KV heads r*Hkv/size .. when Hkv >= size; with fewer KV heads than ranks each KV head is replicated
  on size/Hkv consecutive ranks (rank r holds KV head r*Hkv // size), as SGLang does, so a rank's
  query heads always attend to the KV head their group shares;
- MLP columns r*I/size .. (rows of gate_proj / up_proj, columns of down_proj);
- vocabulary rows r*Vp .. (r+1)*Vp of the embedding and the lm_head, Vp = ceil(V / size); the last
  rank's shard is padded with zero rows (their logits are dropped after gathering).
Norms (and Qwen3's per-head q/k norms) are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.runtime.models.config import ModelConfig


def check_tp_size(config: ModelConfig, size: int) -> None:
    """Raise a ValueError saying what to change when `size` ranks cannot split `config` (a
    mixture-of-experts model runs on one rank only)."""
    if size > 1 and config.num_experts:
        raise ValueError(f"tp_size={size}: tensor parallelism does not split mixture-of-experts models "
                         f"({config.arch}) yet; run it with tp_size=1")
    problems = []
    if config.num_heads % size:
        problems.append(f"{config.num_heads} attention heads")
    if config.num_kv_heads % size and size % config.num_kv_heads:
        problems.append(f"{config.num_kv_heads} KV heads (tp_size must divide them or be a multiple of them)")
    if config.intermediate_size % size:
        problems.append(f"an MLP width of {config.intermediate_size}")
    if problems:
        ok = [n for n in range(1, config.num_heads + 1) if _splits(config, n)]
        raise ValueError(f"tp_size={size} does not divide this model's {' and '.join(problems)}; "
                         f"tp sizes that work for it: {ok}")


def _splits(config: ModelConfig, n: int) -> bool:
    kv_ok = config.num_kv_heads % n == 0 or n % config.num_kv_heads == 0
    return config.num_heads % n == 0 and kv_ok and config.intermediate_size % n == 0


@dataclass(frozen=True)
class ShardPlan:
    """The slices of rank `rank` of `size` (size 1: everything)."""

    config: ModelConfig
    rank: int = 0
    size: int = 1

    @property
    def heads(self) -> int:
        return self.config.num_heads // self.size

    @property
    def kv_heads(self) -> int:
        return max(1, self.config.num_kv_heads // self.size)

    @property
    def kv_head_start(self) -> int:
        n_kv = self.config.num_kv_heads
        return self.rank * self.kv_heads if n_kv >= self.size else self.rank * n_kv // self.size

    @property
    def intermediate(self) -> int:
        return self.config.intermediate_size // self.size

    @property
    def vocab(self) -> int:
        """Rows of the embedding / lm_head shard (the vocabulary padded to a multiple of size)."""
        return -(-self.config.vocab_size // self.size)

    def q_rows(self) -> slice:
        d = self.config.head_dim
        return slice(self.rank * self.heads * d, (self.rank + 1) * self.heads * d)

    def kv_rows(self) -> slice:
        d = self.config.head_dim
        return slice(self.kv_head_start * d, (self.kv_head_start + self.kv_heads) * d)

    def mlp_rows(self) -> slice:
        return slice(self.rank * self.intermediate, (self.rank + 1) * self.intermediate)

    def vocab_rows(self) -> slice:
        """The real vocabulary rows of this shard (at most `vocab`; fewer on a padded last shard)."""
        start = min(self.rank * self.vocab, self.config.vocab_size)
        return slice(start, min(start + self.vocab, self.config.vocab_size))
