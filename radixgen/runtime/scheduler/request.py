"""Req: one sequence's state inside the scheduler, and how it finished.

A request's KV bookkeeping lives in one `KVState` object that only the KV manager
(`kv_manager.py`) writes, and its overlap-schedule bookkeeping in one `Flight` object that the
scheduler loop updates when it launches a batch and when it processes the batch's results (and a
jump-forward marks in-flight results stale).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from radixgen.radix_cache.radix_tree import RadixKey, TreeNode
from radixgen.runtime.speculative.state import SpecState
from radixgen.runtime.tokenizer import IncrementalDetokenizer
from radixgen.sampling.params import SamplingParams

CONSTRAINT_UNFOLLOWABLE = "the output constraint could not be followed"  # start of that abort's message


@dataclass
class FinishReason:
    """Why a request stopped: "stop" (eos / stop token / stop string / grammar end), "length", "abort"."""

    type: str
    matched: int | str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type, "matched": self.matched}
        if self.message:
            d["message"] = self.message
        return d


@dataclass
class KVState:
    """Where a request's KV lives (written by the KV manager only).

    While the request holds a row of req_to_token (`pool_idx`), `req_to_token[pool_idx, :kv_len]`
    are the KV slots of `fill_ids[:kv_len]` scheduled so far, of which the first `done_kv_len` are
    computed. The first `locked_len` slots belong to the radix tree, locked at `last_node`.
    """

    pool_idx: int | None = None
    kv_len: int = 0
    done_kv_len: int = 0
    locked_len: int = 0
    last_node: TreeNode | None = None
    matched: torch.Tensor | None = None  # tree slots matched at admission, copied into the row on admit
    truncate_to: int | None = None  # KV length to cut back to once nothing is in flight (jump-forward)


@dataclass
class Flight:
    """The overlap schedule's view of a request.

    `batches` launched batches hold the request; `pending` tokens sampled by them are not yet known
    to the scheduler, the latest at row `pending_ref` of its batch's sampled tokens (a later batch's
    input placeholder points there); `skip` results are to be discarded because a jump-forward or
    rejected drafts replaced their inputs. A row verifying k draft tokens counts 1 + k pending
    tokens (as if every draft is accepted: a later batch may continue from there) until its result
    says how many were; `held` such rows make the request wait for their result instead.
    """

    batches: int = 0
    pending: int = 0
    pending_ref: int = -1
    skip: int = 0
    held: int = 0

    @property
    def idle(self) -> bool:
        return self.batches == 0

    def launch(self, samples: bool, ref: int, drafts: int = 0, hold: bool = False) -> None:
        self.batches += 1
        self.held += hold
        if samples:
            self.pending += 1 + drafts
            self.pending_ref = ref

    def land(self, sampled: bool, drafts: int = 0, hold: bool = False) -> None:
        self.batches -= 1
        self.held -= hold
        if sampled:
            self.pending -= 1 + drafts


@dataclass(eq=False)
class Req:
    """A request's tokens, cache state and output channel. Compared by identity: the queues'
    `in` / `remove` must not compare every field of two requests (it did: 2.5 ms a finish with
    1,000 requests waiting)."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    seed: int
    detok: IncrementalDetokenizer
    emit: Callable[[dict], None]  # called on the scheduler thread with each output chunk
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    extra_key: str | None = None
    stream: bool = False
    output_ids: list[int] = field(default_factory=list)
    kv: KVState = field(default_factory=KVState)
    flight: Flight = field(default_factory=Flight)
    cached_tokens: int = 0
    sent_ids: int = 0  # output ids already streamed
    finished: FinishReason | None = None
    to_abort: str | None = None
    grammar: Any = None  # per-request Grammar matcher (constrained decoding), or None
    spec: SpecState | None = None  # speculative-decoding state (drafting requests only)
    pooling: str | None = None  # an embedding request ("last" | "mean" token pooling): prefill only
    pooled: torch.Tensor | None = None  # [hidden] sum of its pooled rows' final hidden states so far
    # logprob accumulators: (logprob | None, token id) and top lists
    input_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    created: float = field(default_factory=time.perf_counter)
    scheduled_time: float | None = None  # first admitted to the running batch (its queue wait ends)
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def fill_ids(self) -> list[int]:
        """Every token of the sequence so far (the last output token has no KV yet)."""
        return self.input_ids + self.output_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """fill_ids[start:end] without building the whole sequence (a decode step reads one token)."""
        n_in = len(self.input_ids)
        head = self.input_ids[start:min(end, n_in)] if start < n_in else []
        return head + self.output_ids[max(start - n_in, 0) : max(end - n_in, 0)]

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def known_len(self) -> int:
        """Sequence length counting sampled tokens still in flight."""
        return self.seq_len + self.flight.pending

    @property
    def extend_len(self) -> int:
        """Tokens to compute before the next token can be sampled."""
        return self.known_len - self.kv.kv_len

    @property
    def is_decoding(self) -> bool:
        """Past the prompt: the next step feeds back the last sampled token."""
        return self.is_decode_from(self.kv.kv_len)

    def is_decode_from(self, kv_len: int) -> bool:
        """Whether a step computing from KV length `kv_len` is a decode (one fed-back sampled token)."""
        return bool(self.output_ids or self.flight.pending) and self.known_len - kv_len == 1

    @property
    def wants_more(self) -> bool:
        """Whether another token may follow (max_new_tokens not yet reached counting in-flight ones)."""
        return len(self.output_ids) + self.flight.pending < self.params.max_new_tokens

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs are asked for and the prompt is not computed yet."""
        return self.return_logprob and self.logprob_start_len >= 0 and not self.output_ids

    def prefix_cap(self) -> int:
        """Longest prefix that may come from the cache: at least one token must be computed to
        get logits, and prompt logprobs from `logprob_start_len` need the logits before it."""
        cap = self.seq_len - 1
        if self.pooling == "mean":  # every prompt row's hidden state is pooled: none may come from the cache
            return 0
        if self.wants_prompt_logprobs:
            cap = min(cap, max(self.logprob_start_len - 1, 0))
        return cap

    def hidden_rows(self, start: int, chunk: int) -> list[int]:
        """Offsets within a chunk of `chunk` tokens from `start` whose final hidden states this request
        pools: all of them (mean pooling) or the prompt's last token (last-token pooling)."""
        if self.pooling == "mean":
            return list(range(chunk))
        return [chunk - 1] if self.pooling == "last" and start + chunk == len(self.input_ids) else []

    def add_pooled(self, rows_sum: torch.Tensor) -> None:
        self.pooled = rows_sum if self.pooled is None else self.pooled + rows_sum

    def embedding(self) -> list[float] | None:
        """The pooled hidden state, L2-normalized (as SGLang and vLLM return decoder models' embeddings);
        None before the prompt is computed."""
        if self.pooled is None:
            return None
        v = self.pooled.float().cpu() / (len(self.input_ids) if self.pooling == "mean" else 1)
        return torch.nn.functional.normalize(v, dim=0).tolist()

    def radix_key(self, length: int | None = None) -> RadixKey:
        ids = self.fill_ids
        return RadixKey(ids if length is None else ids[:length], self.extra_key)

    def meta_info(self) -> dict[str, Any]:
        m: dict[str, Any] = {
            "id": self.rid,
            "prompt_tokens": len(self.input_ids),
            "completion_tokens": len(self.output_ids),
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finished.to_dict() if self.finished else None,
            "e2e_latency": time.perf_counter() - self.created,
            # SGLang's names; None until the request is scheduled / has its first token
            "queue_time": None if self.scheduled_time is None else self.scheduled_time - self.created,
            "first_token_latency": None if self.first_token_time is None else self.first_token_time - self.created,
        }
        if self.grammar is not None:
            m.update(self.grammar.meta())  # grammar_backend, grammar_warnings
            if m["finish_reason"] is not None and getattr(self.grammar, "forced", False):
                m["finish_reason"]["forced"] = True  # budget-aware mode closed the output early
        if self.spec is not None:
            m.update(self.spec.meta_info(len(self.output_ids)))
        if self.return_logprob:
            m["input_token_logprobs"] = self.input_logprobs
            m["output_token_logprobs"] = self.output_logprobs
            if self.top_logprobs_num:
                m["input_top_logprobs"] = self.input_top_logprobs
                m["output_top_logprobs"] = self.output_top_logprobs
        return m
