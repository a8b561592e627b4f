"""Tensor parallelism at the model level: tp=2 logits equal tp=1 logits on tiny random Llama, Qwen2
(qkv bias) and Qwen3 (q/k norm) models, over a prefill, a chunked prefill mixed with decodes, a
prefix shared through the KV slots (a radix-cache hit) and 32 decode steps; each rank holds about
half of the weights. The tp=2 runner is rank 0 in this process with rank 1 a child process (gloo).
Qwen3-MoE's tensor parallelism: test_moe.py, through this file's Driver and steps."""

from __future__ import annotations

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.forward_batch import make_forward_batch
from radixgen.runtime.executor.model_runner import ModelRunner

TOL = 2e-3


class Driver:
    """Feeds the same steps to two runners (same KV slots, same req_to_token writes) and collects
    both runners' logits."""

    def __init__(self, ref: ModelRunner, tp: ModelRunner) -> None:
        self.ref, self.tp = ref, tp
        self.rows: dict[int, list[int]] = {}  # request row -> its KV slots so far
        self.max_diff = 0.0

    def step(self, new_tokens: dict[int, list[int]], shared: dict[int, int] | None = None) -> torch.Tensor:
        """One step: request row -> its new tokens; `shared` row -> a row whose first n slots it reuses."""
        for row, (src, n) in (shared or {}).items():
            self.rows[row] = list(self.rows[src][:n])
        rows = list(new_tokens)
        prefix = [len(self.rows.get(r, [])) for r in rows]
        n_new = sum(len(t) for t in new_tokens.values())
        loc = self.ref.token_to_kv_pool.alloc(n_new)
        start = 0
        for r in rows:
            k = len(new_tokens[r])
            self.rows.setdefault(r, []).extend(loc[start : start + k].tolist())
            start += k
        for runner in (self.ref, self.tp):  # the whole row each time: both tables stay equal
            for r in rows:
                runner.req_to_token_pool.write(r, 0, torch.tensor(self.rows[r]))
        outs = []
        for runner in (self.ref, self.tp):
            fb = make_forward_batch([new_tokens[r] for r in rows], prefix, rows, loc,
                                    table_update=runner.req_to_token_pool.take_updates())
            outs.append(runner.forward(fb))
        ref, tp = outs
        assert tp.shape == ref.shape
        self.max_diff = max(self.max_diff, float((tp - ref).abs().max()))
        return ref


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def runners(request, tiny_models):
    model = str(tiny_models[request.param])
    common = dict(model=model, max_total_tokens=1024, max_running_requests=4, context_length=512)
    ref = ModelRunner(EngineConfig(**common))
    from radixgen.runtime.distributed.runner import TPModelRunner

    tp = TPModelRunner(EngineConfig(**common, tp_size=2))
    yield ref, tp
    tp.close()


def drive_mixed_steps(d: Driver, decode_steps: int = 32) -> None:
    """Greedy steps through both runners: a prefill, a chunked prefill beside decodes, a prefix shared
    through the KV slots (a radix-cache hit), then `decode_steps` decode steps of every request."""
    g = torch.Generator().manual_seed(0)
    prompt = lambda n: torch.randint(3, 40000, (n,), generator=g).tolist()  # noqa: E731
    a, b = prompt(40), prompt(50)
    last = {0: d.step({0: a})[0].argmax().item()}  # prefill A
    for i in range(0, 50, 20):  # B prefilled in chunks of 20, A decoding beside it
        logits = d.step({0: [last[0]], 1: b[i : i + 20]})
        last[0] = logits[0].argmax().item()
    last[1] = logits[1].argmax().item()
    logits = d.step({2: prompt(7)}, shared={2: (0, 30)})  # C reuses A's first 30 KV slots (a cache hit)
    last[2] = logits[0].argmax().item()
    for _ in range(decode_steps):
        logits = d.step({r: [t] for r, t in last.items()})
        last = {r: logits[i].argmax().item() for i, r in enumerate(last)}


def test_tp2_logits_equal_tp1(runners):
    ref, tp = runners
    d = Driver(ref, tp)
    drive_mixed_steps(d)
    assert d.max_diff < TOL, f"tp=2 logits differ from tp=1 by {d.max_diff}"


def test_each_rank_holds_half_of_the_weights(runners):
    ref, tp = runners
    size = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert size(tp.model) < 0.55 * size(ref.model)  # norms are replicated; everything else is split
    assert tp.token_to_kv_pool.k_buffer[0].shape[1] * 2 == ref.token_to_kv_pool.k_buffer[0].shape[1]
