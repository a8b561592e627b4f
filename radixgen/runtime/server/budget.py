"""What one request may cost the engine: prompt tokens, output room, its share of the KV pool, and
its place in the queue.

- `TokenBudget.tokenize` (run on a worker thread) rejects a text before tokenizing it when it must
  have more tokens than a prompt may: a token spans at most `max_token_chars` characters (the longest
  token of the vocabulary), so `len(text) / max_token_chars` is a lower bound on its token count.
  A 50 MB prompt is refused in microseconds instead of being tokenized for a minute.
- `check_generation`: a `max_tokens` over the room the context leaves is a 400 like the hosted APIs'
  (`context_length_exceeded`), or is cut to the room with `--allow-auto-truncate`; and the prompts
  plus n x max_tokens may claim at most `max_request_kv_fraction` of the KV pool.
- `Admission` counts the sequences in flight through the server: past `max_running_requests +
  max_queued_requests` a request gets 429 with `Retry-After`, as the hosted APIs answer when busy.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from typing import Any

from radixgen.runtime.server.options import ServerOptions
from radixgen.runtime.server.protocol import APIError, bad_request
from radixgen.sampling.params import SamplingParams

RETRY_AFTER_S = 1
DEFAULT_MAX_NEW_TOKENS = SamplingParams.max_new_tokens  # the engine's default
NORMALIZER_SLACK = 4  # a normalizer may compose a few characters into one (NFC: at most 3 into 1)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class RetryLater(APIError):
    """A 429 carrying a `Retry-After` header."""

    def __init__(self, message: str) -> None:
        super().__init__(429, message, "rate_limit_error", None, "queue_full")
        self.headers = {"Retry-After": str(RETRY_AFTER_S)}


def max_token_chars(tokenizer: Any) -> int | None:
    """An upper bound on the characters one token covers, from the vocabulary (None if unknown)."""
    hf = getattr(tokenizer, "hf", None)
    if hf is None:
        return None
    pieces = hf.convert_ids_to_tokens(list(range(len(hf))))
    longest = max((len(p) for p in pieces if isinstance(p, str)), default=0)
    if longest == 0:
        return None
    normalizer = getattr(getattr(hf, "backend_tokenizer", None), "normalizer", None)
    return longest * (NORMALIZER_SLACK if normalizer is not None else 1)


class TokenBudget:
    """Prompt and output limits of one engine under `ServerOptions`."""

    def __init__(self, tokenizer: Any, context_length: int, kv_capacity: int, opts: ServerOptions) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.opts = opts
        self.max_prompt = min(opts.max_prompt_tokens or context_length - 1, context_length - 1)
        self.kv_limit = int(opts.max_request_kv_fraction * kv_capacity)
        self._chars: int | None | bool = False  # False: not computed yet

    def _max_chars(self) -> int | None:
        if self._chars is False:
            self._chars = max_token_chars(self.tokenizer)
        return self._chars  # type: ignore[return-value]

    def tokenize(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a prompt text, checked against the prompt limit (blocking: call off the loop)."""
        chars = self._max_chars()
        if chars is not None and len(text) > self.max_prompt * chars:
            raise self._too_long(f"at least {-(-len(text) // chars)}", param)
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        self.check_prompt(ids, param)
        return ids

    def max_string_bytes(self) -> int | None:
        """An upper bound on the bytes of any JSON string a valid request holds (None if unknown): a prompt
        text of at most max_prompt x max_token_chars characters, a schema, regex or stop string within
        its limit, each character at most 6 bytes as JSON (a \\uXXXX escape)."""
        chars = self._max_chars()
        if chars is None:
            return None
        return 6 * max(self.max_prompt * chars, self.opts.max_schema_bytes, self.opts.max_stop_length)

    def check_prompt(self, ids: list[int], param: str) -> None:
        if len(ids) > self.max_prompt:
            raise self._too_long(str(len(ids)), param)

    def _too_long(self, count: str, param: str) -> APIError:
        if self.max_prompt == self.context_length - 1:
            return bad_request(f"This model's maximum context length is {self.context_length} tokens, but the "
                               f"prompt has {count} tokens; shorten the prompt", param, "context_length_exceeded")
        return bad_request(f"The prompt has {count} tokens; this server allows {self.max_prompt} "
                           f"({_flag('max_prompt_tokens')})", param, "context_length_exceeded")

    def default_max_tokens(self, ids: list[int], n: int = 1) -> int:
        """max_tokens when the client gives none: the context room, within the request's KV share."""
        room = max(self.context_length - len(ids), 0)
        share = (self.kv_limit - len(ids)) // max(n, 1)
        return max(min(room, share), 1) if room else 0

    def check_generation(self, prompts: list[list[int]], params: list[dict], param: str) -> None:
        """Check each prompt's max_new_tokens against the context room (with --allow-auto-truncate the
        engine cuts it instead), and the whole request against its KV share. A prompt repeated for the
        choices of n > 1 counts once: the choices share its KV through the radix cache."""
        kv = 0
        seen: set[tuple[int, ...]] = set()
        for ids, sp in zip(prompts, params, strict=True):
            want = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
            n = sp.get("n", 1)
            if not isinstance(want, int) or not isinstance(n, int):
                continue  # the engine's validation names the bad type
            room = self.context_length - len(ids)
            if want > room and not self.opts.allow_auto_truncate:
                raise bad_request(
                    f"This model's maximum context length is {self.context_length} tokens. However, you "
                    f"requested {len(ids) + want} tokens ({len(ids)} in the prompt, {want} for the "
                    f"completion). Reduce the prompt or {param} (or start the server with "
                    f"{_flag('allow_auto_truncate')})", param, "context_length_exceeded")
            key = tuple(ids)
            kv += (0 if key in seen else len(ids)) + max(n, 1) * max(min(want, room), 0)
            seen.add(key)
        if kv > self.kv_limit:
            share = self.opts.max_request_kv_fraction
            raise bad_request(f"This request may need {kv} tokens of KV cache (prompt tokens + n x {param}); this "
                              f"server gives one request at most {self.kv_limit} ({share:g} of the KV pool, "
                              f"{_flag('max_request_kv_fraction')}): lower n or {param}", param, "request_too_large")


class Admission:
    """Sequences in flight through the server (event-loop thread only), capped at `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_flight = 0

    def hold_each(self, sequences: list[int]) -> list[Hold]:
        """Places for the engine calls of one request (all or none): 400 if the request alone is over
        the capacity, 429 if it does not fit now."""
        total = sum(sequences)
        if total > self.capacity:
            raise bad_request(f"This request starts {total} sequences; this server holds at most "
                              f"{self.capacity} at once (max_running_requests + {_flag('max_queued_requests')})",
                              "n", "request_too_large")
        if self.in_flight + total > self.capacity:
            raise RetryLater(f"The server is busy: {self.in_flight} sequences are in flight and its queue is full "
                             f"({self.capacity}); retry after {RETRY_AFTER_S} s")
        self.in_flight += total
        return [Hold(self, n) for n in sequences]


class Hold:
    """A place in `Admission`; `release()` gives it back (once; also when the Hold is dropped)."""

    def __init__(self, admission: Admission, sequences: int) -> None:
        self._done = weakref.finalize(self, Hold._give_back, admission, sequences)

    @staticmethod
    def _give_back(admission: Admission, sequences: int) -> None:
        admission.in_flight -= sequences

    def release(self) -> None:
        self._done()


class HeldStream:
    """An engine stream that releases its `Hold` when it ends or is closed."""

    def __init__(self, it: AsyncIterator[dict], hold: Hold) -> None:
        self._it, self._hold = it, hold

    def __aiter__(self) -> HeldStream:
        return self

    async def __anext__(self) -> dict:
        try:
            return await self._it.__anext__()
        except BaseException:
            self._hold.release()
            raise

    async def aclose(self) -> None:
        try:
            await self._it.aclose()
        finally:
            self._hold.release()
