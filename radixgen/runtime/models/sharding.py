"""Which part of each weight a tensor-parallel rank holds (Megatron-style sharding of a Llama-family model).

With `size` ranks, rank r holds:
- query heads r*H/size .. (r+1)*H/size (rows of q_proj, columns of o_proj);
- KV heads r*Hkv/size .. when Hkv >= size; with fewer KV heads than ranks each KV head is replicated
  on size/Hkv consecutive ranks (rank r holds KV head r*Hkv // size), as SGLang does, so a rank's
  query heads always attend to the KV head their group shares;
- MLP columns r*I/size .. (rows of gate_proj / up_proj, columns of down_proj);
- in a mixture-of-experts layer, every expert, each over its columns r*Ie/size .. of the expert width Ie
  (moe_intermediate_size; rows of its gate_proj / up_proj, columns of its down_proj), as SGLang's
  default MoE tensor parallelism does: routing is computed on every rank alike (the router is
  replicated) and the layer's summed output is all-reduced once (`moe.MoEMLP`);
- vocabulary rows r*Vp .. (r+1)*Vp of the embedding and the lm_head, Vp = ceil(V / size); the last
  rank's shard is padded with zero rows (their logits are dropped after gathering).
Norms (and Qwen3's per-head q/k norms) are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.runtime.models.config import ModelConfig


def check_tp_size(config: ModelConfig, size: int) -> None:
    """Raise a ValueError saying what to change when `size` ranks cannot split `config`."""
    problems = []
    if config.num_heads % size:
        problems.append(f"{config.num_heads} attention heads")
    if config.num_kv_heads % size and size % config.num_kv_heads:
        problems.append(f"{config.num_kv_heads} KV heads (tp_size must divide them or be a multiple of them)")
    if _has_dense_mlp(config) and config.intermediate_size % size:
        problems.append(f"MLP width (intermediate_size) of {config.intermediate_size}")
    if config.num_experts and config.moe_intermediate_size % size:
        problems.append(f"expert MLP width (moe_intermediate_size) of {config.moe_intermediate_size}")
    if problems:
        ok = [n for n in range(1, config.num_heads + 1) if _splits(config, n)]
        raise ValueError(f"tp_size={size} does not divide this model's {' and '.join(problems)}; "
                         f"tp sizes that work for it: {ok}")


def _splits(config: ModelConfig, n: int) -> bool:
    """Whether n ranks split every dimension of `config` that tensor parallelism divides."""
    kv_ok = config.num_kv_heads % n == 0 or n % config.num_kv_heads == 0
    mlp_ok = not _has_dense_mlp(config) or config.intermediate_size % n == 0
    experts_ok = not config.num_experts or config.moe_intermediate_size % n == 0
    return config.num_heads % n == 0 and kv_ok and mlp_ok and experts_ok


def _has_dense_mlp(config: ModelConfig) -> bool:
    """Whether some layer of `config` has a dense MLP (of `intermediate_size`), not a mixture of experts."""
    return any(not config.is_moe(i) for i in range(config.num_layers))


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
    def expert_intermediate(self) -> int:
        """Each expert's width on this rank (its columns of moe_intermediate_size)."""
        return self.config.moe_intermediate_size // self.size

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

    def expert_rows(self) -> slice:
        """This rank's rows of every expert's gate_proj / up_proj (and columns of its down_proj)."""
        return slice(self.rank * self.expert_intermediate, (self.rank + 1) * self.expert_intermediate)

    def vocab_rows(self) -> slice:
        """The real vocabulary rows of this shard (at most `vocab`; fewer on a padded last shard)."""
        start = min(self.rank * self.vocab, self.config.vocab_size)
        return slice(start, min(start + self.vocab, self.config.vocab_size))
