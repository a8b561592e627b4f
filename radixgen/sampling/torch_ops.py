"""Batched sampling in plain torch: the CPU path and the oracle the fused Triton kernel is tested against.

One step of sampling, for logits [B, V]:

1. logit processing: grammar bitmask (disallowed -> -inf), `logit_bias`, penalties on the tokens
   generated so far (repetition: divide positive / multiply negative logits of seen tokens;
   frequency: subtract `f * count`; presence: subtract `p * (count > 0)`), and the min-new-tokens
   ban of eos / stop ids. Logprobs are the log_softmax of these processed logits.
2. greedy rows take the argmax (an all-greedy batch is one argmax: no softmax, no RNG).
3. other rows: logits / temperature, then top-k, then top-p on the renormalised top-k
   distribution (vLLM's order), then min-p (`p >= min_p * p_max`). Cuts are tie-inclusive: a
   token survives top-k when its logit is >= the k-th largest, and top-p when the probability mass
   strictly above it is < top_p.
4. inverse-CDF draw over the survivors, in vocabulary order, with one uniform per row from a
   counter-based hash of (seed, step): a row's draw never depends on the rest of the batch, and the
   Triton kernel computes the very same uniform.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixgen.common.transfer import to_device
from radixgen.sampling.params import SamplingParams

NEG_INF = float("-inf")
_M32 = 0xFFFFFFFF
_SEED_MASK = (1 << 63) - 1
# top-p first looks for the nucleus among this many best tokens, then falls back to a full sort.
_TOP_P_CANDIDATES = 1024


@dataclass
class SampleOutput:
    """Result of one sampling step."""

    next_token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None = None  # [B] float32, logprob of the chosen token
    top_logprob_ids: torch.Tensor | None = None  # [B, K] int64
    top_logprob_values: torch.Tensor | None = None  # [B, K] float32


@dataclass
class SamplingBatch:
    """Per-request sampling parameters as tensors, built once per step by `build`.

    Optional tensors are None when no row needs them, so the common case costs nothing.
    Greedy rows are normalised to temperature 0, top_k V, top_p 1, min_p 0.
    """

    vocab_size: int
    temperatures: torch.Tensor  # [B] float32, 0 = greedy
    top_ps: torch.Tensor  # [B] float32 in (0, 1]
    top_ks: torch.Tensor  # [B] int64 in [1, V] (-1 -> V)
    min_ps: torch.Tensor  # [B] float32 in [0, 1]
    seeds: torch.Tensor  # [B] int64 >= 0
    steps: torch.Tensor  # [B] int64, tokens generated so far (the RNG counter)
    repetition_penalties: torch.Tensor | None = None  # [B] float32
    frequency_penalties: torch.Tensor | None = None  # [B] float32
    presence_penalties: torch.Tensor | None = None  # [B] float32
    output_counts: torch.Tensor | None = None  # [B, V] int32, occurrences in the output so far
    logit_bias: torch.Tensor | None = None  # [B, V] float32
    min_tokens_ban: torch.Tensor | None = None  # [N] int64 flat indices row * V + token
    all_greedy: bool = False
    any_greedy: bool = False
    need_top_k: bool = False
    need_top_p: bool = False
    need_min_p: bool = False
    need_penalties: bool = False
    need_logprobs: bool = False
    max_top_logprobs: int = 0

    @property
    def batch_size(self) -> int:
        return self.temperatures.shape[0]

    @property
    def greedy_rows(self) -> torch.Tensor:
        return self.temperatures == 0  # [B] bool

    @property
    def inv_temperatures(self) -> torch.Tensor:
        """1 / temperature, and 1 for greedy rows (their scaled logits are never used)."""
        t = self.temperatures
        return torch.where(t == 0, torch.ones_like(t), 1.0 / t)  # [B]

    @property
    def log_min_ps(self) -> torch.Tensor:
        return torch.log(self.min_ps)  # [B], -inf where min_p == 0

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        output_ids: list[list[int]],
        seeds: list[int],
        vocab_size: int,
        eos_token_ids: list[int],
        device: torch.device | str = "cpu",
    ) -> SamplingBatch:
        """Turn validated per-request params into batch tensors (a few host->device copies)."""
        V = vocab_size
        greedy = [p.is_greedy for p in params]
        temps = [0.0 if g else float(p.temperature) for p, g in zip(params, greedy, strict=True)]
        top_ps = [1.0 if g else float(p.top_p) for p, g in zip(params, greedy, strict=True)]
        min_ps = [0.0 if g else float(p.min_p) for p, g in zip(params, greedy, strict=True)]
        top_ks = [V if g or p.top_k < 0 else min(p.top_k, V) for p, g in zip(params, greedy, strict=True)]
        steps = [len(o) for o in output_ids]
        floats = to_device(torch.tensor([temps, top_ps, min_ps], dtype=torch.float32), device)  # [3, B]
        ints = to_device(torch.tensor(
            [top_ks, [s & _SEED_MASK for s in seeds], steps], dtype=torch.int64
        ), device)  # [3, B]
        batch = cls(
            vocab_size=V,
            temperatures=floats[0],
            top_ps=floats[1],
            min_ps=floats[2],
            top_ks=ints[0],
            seeds=ints[1],
            steps=ints[2],
            all_greedy=all(greedy),
            any_greedy=any(greedy),
            need_top_k=any(k < V for k in top_ks),
            need_top_p=any(p < 1.0 for p in top_ps),
            need_min_p=any(p > 0.0 for p in min_ps),
            need_logprobs=any(p.logprobs or p.top_logprobs > 0 for p in params),
            max_top_logprobs=max((p.top_logprobs for p in params), default=0),
        )
        if any(p.needs_penalties for p in params):
            pen = to_device(torch.tensor(
                [[p.repetition_penalty for p in params], [p.frequency_penalty for p in params],
                 [p.presence_penalty for p in params]], dtype=torch.float32,
            ), device)  # [3, B]
            batch.repetition_penalties, batch.frequency_penalties, batch.presence_penalties = pen.unbind(0)
            batch.output_counts = token_counts(output_ids, V, device)
            batch.need_penalties = True
        if any(p.logit_bias for p in params):
            rows = [i for i, p in enumerate(params) for _ in (p.logit_bias or {})]
            toks = [t for p in params for t in (p.logit_bias or {})]
            vals = [float(b) for p in params for b in (p.logit_bias or {}).values()]
            bias = torch.zeros(len(params) * V, dtype=torch.float32, device=device)  # [B * V]
            idx = torch.tensor(rows, dtype=torch.int64) * V + torch.tensor(toks, dtype=torch.int64)
            bias.index_put_((to_device(idx, device),), to_device(torch.tensor(vals, dtype=torch.float32), device))
            batch.logit_bias = bias.view(len(params), V)
        ban = []
        for i, (p, n_out) in enumerate(zip(params, steps, strict=True)):
            if n_out < p.min_new_tokens:
                ids = set(p.stop_token_ids or []) | (set() if p.ignore_eos else set(eos_token_ids))
                ban.extend(i * V + t for t in sorted(ids) if 0 <= t < V)
        if ban:
            batch.min_tokens_ban = to_device(torch.tensor(ban, dtype=torch.int64), device)
        return batch


def token_counts(output_ids: list[list[int]], vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """Occurrences of each token in each row's output, [B, V] int32, by one scatter_add."""
    B = len(output_ids)
    lengths = torch.tensor([len(o) for o in output_ids], dtype=torch.int64)  # [B]
    flat = torch.tensor(list(itertools.chain.from_iterable(output_ids)), dtype=torch.int64)  # [T]
    idx = torch.repeat_interleave(torch.arange(B), lengths) * vocab_size + flat  # [T]
    counts = torch.zeros(B * vocab_size, dtype=torch.int32, device=device)  # [B * V]
    counts.scatter_add_(0, to_device(idx, device), torch.ones(idx.shape[0], dtype=torch.int32, device=device))
    return counts.view(B, vocab_size)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2^32) (no int64 overflow:
    the multiplier is < 2^31). The Triton kernel runs the same function."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    return (x >> 16) ^ x


def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Uniform floats in (0, 1) keyed by (seed, step): a counter-based RNG with no state.
    seeds, steps: [B] int64 >= 0 -> [B] float32 (23 random bits, never 0 or 1)."""
    h = _mix32((seeds & _M32) ^ 0x9E3779B9)
    h = _mix32(h ^ ((seeds >> 32) & _M32) ^ 0x85EBCA6B)
    h = _mix32(h ^ (((steps & _M32) * 0x2545F491 + 0xC2B2AE35) & _M32))
    h = _mix32(h ^ 0x27D4EB2F)
    return ((h >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)


def check_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Raise unless bitmask is [B, W >= ceil(V / 32)] for logits [B, V]."""
    B, V = logits.shape
    if bitmask.dim() != 2 or bitmask.shape[0] != B or bitmask.shape[1] * 32 < V:
        raise ValueError(f"bitmask must be int32 [{B}, >= {(V + 31) // 32}], got {tuple(bitmask.shape)}")


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """In place: logits[b, t] = -inf where bit t % 32 of bitmask[b, t // 32] is 0.
    logits [B, V] float, bitmask [B, W] int32 with W >= ceil(V / 32). Returns logits."""
    check_bitmask(logits, bitmask)
    B, V = logits.shape
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    allowed = ((bitmask.to(torch.int32)[:, :, None] >> shifts) & 1).view(B, -1)[:, :V]  # [B, V]
    return logits.masked_fill_(allowed == 0, NEG_INF)


def apply_penalties_(
    logits: torch.Tensor, counts: torch.Tensor, repetition: torch.Tensor, frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """In place, on logits [B, V] with output counts [B, V] and per-row penalties [B]."""
    seen = counts > 0  # [B, V]
    rep = repetition[:, None]  # [B, 1]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)  # [B, V]
    logits.copy_(torch.where(seen, penalised, logits))
    logits -= frequency[:, None] * counts
    logits -= presence[:, None] * seen
    return logits


def process_logits(
    logits: torch.Tensor, batch: SamplingBatch, bitmask: torch.Tensor | None = None,
    apply_mask: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = apply_token_bitmask_,
) -> torch.Tensor:
    """Bitmask (by `apply_mask`, default `apply_token_bitmask_`), logit bias, penalties, min-new-tokens
    ban. Returns a new tensor when anything applies, else `logits` itself (never modified)."""
    if bitmask is None and batch.logit_bias is None and not batch.need_penalties and (
        batch.min_tokens_ban is None
    ):
        return logits
    out = logits.to(torch.float32, copy=True)  # [B, V]
    if bitmask is not None:
        apply_mask(out, bitmask)
    if batch.logit_bias is not None:
        out += batch.logit_bias
    if batch.need_penalties:
        apply_penalties_(out, batch.output_counts, batch.repetition_penalties,
                         batch.frequency_penalties, batch.presence_penalties)
    if batch.min_tokens_ban is not None:
        out.view(-1).index_fill_(0, batch.min_tokens_ban, NEG_INF)
    return out


def truncation_threshold(
    x: torch.Tensor, weights: torch.Tensor, x_max: torch.Tensor, batch: SamplingBatch
) -> torch.Tensor | None:
    """Per-row logit threshold of top-k, then top-p, then min-p: a token survives iff x >= it.
    x [B, V] temperature-scaled logits, weights = exp(x - x_max) [B, V], x_max [B].
    Returns [B] float32 (-inf where a row cuts nothing), or None when no row cuts."""
    B, V = x.shape
    threshold = None
    if batch.need_top_k or batch.need_top_p:
        k, p = batch.top_ks, batch.top_ps  # [B], [B]
        k_max = int(torch.where(k < V, k, 0).max()) if batch.need_top_k else 0
        n_cand = min(V, max(k_max, _TOP_P_CANDIDATES)) if batch.need_top_p else k_max
        vals = x.topk(n_cand, dim=-1).values  # [B, n_cand], descending
        kth = torch.full_like(x_max, NEG_INF)  # [B]
        if batch.need_top_k:
            kth = torch.where(k < V, vals.gather(1, (k.clamp(max=n_cand) - 1)[:, None]).squeeze(1), kth)
            threshold = kth
        if batch.need_top_p:
            vals = vals.masked_fill(vals < kth[:, None], NEG_INF)  # top-k survivors only
            w_sorted = torch.exp(vals - x_max[:, None])  # [B, n_cand]
            if batch.need_top_k and bool((vals[:, -1] == NEG_INF).all()):
                total = w_sorted.sum(-1)  # [B]: every row's top-k survivors are among the candidates
            else:
                total = torch.where(x >= kth[:, None], weights, 0.0).sum(-1)  # [B]
            limit = (p * total)[:, None]  # [B, 1]
            inside = (w_sorted.cumsum(-1) - w_sorted) < limit  # mass strictly above each rank < top_p
            if n_cand < V and not bool((~inside[:, -1] | (p >= 1)).all()):
                vals = x.masked_fill(x < kth[:, None], NEG_INF).sort(dim=-1, descending=True).values
                w_sorted = torch.exp(vals - x_max[:, None])  # [B, V]: the nucleus is past the candidates
                inside = (w_sorted.cumsum(-1) - w_sorted) < limit
            n_keep = inside.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
            top_p_cut = vals.gather(1, n_keep - 1).squeeze(1)  # [B], smallest logit in the nucleus
            top_p_cut = torch.where(p < 1, top_p_cut, torch.full_like(top_p_cut, NEG_INF))
            threshold = top_p_cut if threshold is None else torch.maximum(threshold, top_p_cut)
    if batch.need_min_p:
        floor = x_max + batch.log_min_ps  # [B]: p >= min_p * p_max
        threshold = floor if threshold is None else torch.maximum(threshold, floor)
    return threshold


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw index i with probability weights[i] / sum, in vocabulary order: the first i whose
    running sum exceeds u * sum (the last positive weight if rounding leaves none).
    weights [B, V] >= 0 (consumed: becomes the running sum), u [B] in (0, 1) -> [B] int64."""
    B, V = weights.shape
    cdf = weights.cumsum_(-1)  # [B, V]
    target = u * cdf[:, -1]  # [B]
    idx = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1).clamp_(max=V - 1)  # [B]
    step = cdf.gather(1, idx[:, None]).squeeze(1) - torch.where(
        idx > 0, cdf.gather(1, (idx - 1).clamp(min=0)[:, None]).squeeze(1), torch.zeros_like(target))
    bad = step <= 0  # landed on a zero weight: only through rounding at the very end
    if bool(bad.any()):
        grows = torch.diff(cdf, dim=-1, prepend=torch.zeros_like(cdf[:, :1])) > 0  # [B, V]
        positive_last = V - 1 - grows.flip(-1).to(torch.uint8).argmax(-1)
        idx = torch.where(bad, positive_last, idx)
    return idx


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:  # [B] int64
    """Each row's argmax (the first of equal maxima), for logits [B, V]. `max(-1).indices` is the same
    index as `argmax(-1)` and ~3x faster on CPU (SmolLM2's [64, 49152] on one thread: 1.7 vs 5.7 ms)."""
    return logits.max(-1).indices


Draw = Callable[[torch.Tensor, SamplingBatch], torch.Tensor | None]  # processed logits, batch -> [B] tokens or None


@dataclass(frozen=True)
class SamplerKernels:
    """Faster stand-ins for steps of the torch sampler, which the runtime passes on CPU; each computes
    what the step it replaces computes (None: torch's own step)."""

    argmax: Callable[[torch.Tensor], torch.Tensor] | None = None  # [B, V] -> [B] int64, first of equal maxima
    draw: Draw | None = None  # as `draw_tokens`, or None where it cannot run
    apply_mask: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # as `apply_token_bitmask_`


def draw_tokens(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:  # [B] int64
    """Each row's token drawn from processed logits [B, V]: temperature, top-k / top-p / min-p cuts,
    then the inverse CDF at the row's counter-based uniform (greedy rows' draws are not used)."""
    x = logits * batch.inv_temperatures[:, None]  # [B, V]
    x_max = x.amax(-1)  # [B]
    weights = torch.sub(x, x_max[:, None]).exp_()  # [B, V]
    threshold = truncation_threshold(x, weights, x_max, batch)
    if threshold is not None:
        weights.masked_fill_(x < threshold[:, None], 0.0)
    return inverse_cdf(weights, counter_uniform(batch.seeds, batch.steps))


def sample(logits: torch.Tensor, batch: SamplingBatch, bitmask: torch.Tensor | None = None,
           kernels: SamplerKernels | None = None) -> SampleOutput:
    """Sample one token per row. logits [B, V] float32; bitmask int32 [B, ceil(V/32)] or None;
    `kernels`: faster stand-ins for some steps (default: torch's own)."""
    k = kernels or SamplerKernels()
    argmax = k.argmax or greedy_tokens
    logits = process_logits(logits, batch, bitmask, k.apply_mask or apply_token_bitmask_)  # [B, V]
    if batch.all_greedy:
        tokens = argmax(logits)  # [B]
    else:
        tokens = k.draw(logits, batch) if k.draw is not None else None
        if tokens is None:
            tokens = draw_tokens(logits, batch)
        if batch.any_greedy:
            tokens = torch.where(batch.greedy_rows, argmax(logits), tokens)
    return finish_output(tokens, logits, batch)


def finish_output(
    tokens: torch.Tensor, logits: torch.Tensor, batch: SamplingBatch, chosen_logprobs: torch.Tensor | None = None
) -> SampleOutput:
    """Attach logprobs (log_softmax of the processed logits) when the batch asks for them."""
    out = SampleOutput(next_token_ids=tokens)
    if not batch.need_logprobs:
        return out
    if chosen_logprobs is not None and batch.max_top_logprobs == 0:
        out.logprobs = chosen_logprobs
        return out
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
    out.logprobs = logprobs.gather(1, tokens[:, None]).squeeze(1) if chosen_logprobs is None else chosen_logprobs
    if batch.max_top_logprobs > 0:
        top = logprobs.topk(batch.max_top_logprobs, dim=-1)
        out.top_logprob_values, out.top_logprob_ids = top.values, top.indices  # [B, K]
    return out
