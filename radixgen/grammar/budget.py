"""Budget-aware constrained decoding: outputs that still parse when max_new_tokens runs out.

Opt-in per request (`SamplingParams.budget_aware`). The runtime tells the request's grammar how many
tokens it may still emit (`Grammar.set_budget`) before each mask fill. `BudgetAwareGrammar` keeps a
short completion of the output so far (close the string, the arrays and objects, fill the remaining
required keys minimally) and, with `need` = its tokens + one stop token:
- remaining > need + margin + window: the mask is the grammar's;
- in the window before that: tokens that open new structure (any of `,` `{` `[` `"` `\\`: a new
  item, key, object, array, string or escape) are masked out, except the completion's next token;
  what is being written (a string's text, a number's digits) can go on;
- remaining <= need + margin: only the completion's next token (the stop tokens once complete).
The output then ends complete and valid; `forced` records that the budget closed it (the engine
reports it in `finish_reason`).

Soundness: within the window a token adds at most a few tokens to the completion (a digit, an
exponent, a literal's rest: `margin` covers it); before the window a token may open anything, so the
guarantee needs no single token there to lengthen the completion by more than window + margin (an
array item or optional value longer than ~28 tokens, opened right at the window's edge, is the
exception; `overshoot` then records that the completion no longer fit).

The completion is searched byte by byte on a copy of the matcher: forced strings are taken whole;
where several bytes are allowed, closing ones come first (`"` inside a JSON string, `}` / `]` / `,`
outside), then the shortest values (a digit, `""`, `null`, ...), avoiding bytes already used four
times (so a loop like `[0-9]+x` reaches its `x`); each candidate is tried with one accept, far
cheaper than a mask fill. Its tokens are the longest the grammar's masks allow at each point (one
mask fill per token). Following it is consistent (each forced token shortens it by one), so it is
searched again only after a token off the completion: about 0.2-3 ms.

The search goes as far as 8 bytes per token of the request's budget (512 bytes at least, 16 KB at
most; a JSON completion spells ~3 bytes a token), in time linear in the bytes: an object of 24
required string fields needs ~550 bytes in ~170 tokens, which a fixed 512-byte limit refused ("no
completion was found") under max_new_tokens=384.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from radixgen.grammar.base import Grammar, GrammarError, allocate_bitmask, set_token_bit, stop_only_row
from radixgen.grammar.vocab import cached_token_bytes, single_byte_tokens

DEFAULT_MARGIN = 4  # tokens of slack for what one token of the window may add to the completion
DEFAULT_WINDOW = 24  # tokens before engaging in which no new structure may be opened
MAX_COMPLETION_BYTES = 512  # how far the search goes at least (and without a budget)
SEARCH_BYTES_PER_TOKEN = 8  # ... and with a budget of n tokens, up to 8 n bytes
MAX_SEARCH_BYTES = 16384
_OPENERS = frozenset(b',{["\\')
_LETTERS_DIGITS = bytes(range(ord("a"), ord("z") + 1)) + bytes(range(ord("0"), ord("9") + 1))
_IN_STRING = b'"@:/-_. ' + _LETTERS_DIGITS + bytes(range(ord("A"), ord("Z") + 1))
_OUTSIDE = b"}],1234567890\"ntf[{-" + bytes(range(ord("a"), ord("z") + 1)) + b".:"  # "-1" beats "-0.001"


def _json_string_state(data: bytes, inside: bool = False, escaped: bool = False) -> tuple[bool, bool]:
    """(inside a string literal, after a backslash in one) at the end of JSON text `data`, read from
    the state (`inside`, `escaped`) before it."""
    for b in data:
        if escaped:
            escaped = False
        elif inside and b == 0x5C:  # backslash
            escaped = True
        elif b == 0x22:  # quote
            inside = not inside
    return inside, escaped


def search_bytes(max_new_tokens: int | None) -> int:
    """How many bytes the completion search may go for a request allowed `max_new_tokens` tokens."""
    if max_new_tokens is None:
        return MAX_COMPLETION_BYTES
    return min(max(MAX_COMPLETION_BYTES, SEARCH_BYTES_PER_TOKEN * max_new_tokens), MAX_SEARCH_BYTES)


def safe_token_mask(table: Sequence[bytes | None], vocab_size: int) -> torch.Tensor:
    """Bitmask row (int32 `[ceil(V/32)]`) of the tokens that open no new structure: none of the
    bytes `,` `{` `[` `"` `\\` (no new item, key, object, array, string or escape)."""
    row = allocate_bitmask(1, vocab_size)[0].zero_()
    words = [0] * row.shape[0]
    for idx, data in enumerate(table):
        if data is not None and not any(b in _OPENERS for b in data):
            words[idx >> 5] |= 1 << (idx & 31)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


class ShortestCompletion:
    """Finds a short completion of a matcher's output; one per engine (tokenizer + vocabulary), shared
    by every request's matcher and so used from several threads at once (requests' threads build
    matchers while the worker fills masks): it holds no state that changes after construction."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.table = cached_token_bytes(tokenizer.hf, vocab_size)
        self.byte_token = single_byte_tokens(self.table)  # byte value -> token id
        self._orders = {inside: self._order(pref) for inside, pref in ((True, _IN_STRING), (False, _OUTSIDE))}
        self.safe = safe_token_mask(self.table, vocab_size)
        self.token_of: dict[bytes, int] = {}  # bytes -> a token spelling them
        for idx, data in enumerate(self.table):
            if data:
                self.token_of.setdefault(data, idx)
        self.max_token_bytes = max(len(d) for d in self.token_of)
        self.vocab_size = vocab_size

    def _order(self, preferred: bytes) -> list[int]:
        rank: dict[int, int] = {}
        for i, b in enumerate(preferred):
            rank.setdefault(b, i)
        return sorted((b for b in self.byte_token if b != 0x5C), key=lambda b: (rank.get(b, len(rank)), b))

    def completion(self, grammar: Grammar, output: bytes, max_bytes: int = MAX_COMPLETION_BYTES) -> bytes | None:
        """Bytes completing `grammar`, whose output so far is `output` (b"" if it may end now);
        None if none was found within `max_bytes`. Time linear in the bytes searched."""
        g = grammar.copy()
        out = bytearray()
        picks = [0] * 256  # times each byte was picked since the last forced string (loop avoidance)
        inside, escaped = _json_string_state(output)
        while not g.can_terminate():
            if len(out) > max_bytes:
                return None
            forced = g.jump_forward()
            data = forced.encode("utf-8") if forced else b""
            if data and g.accept_tokens([self.byte_token[b] for b in data]):
                out += data
                picks = [0] * 256
                inside, escaped = _json_string_state(data, inside, escaped)
                continue
            nxt = self._next_byte(g, picks, inside)
            if nxt is None:
                return None
            out.append(nxt)
            picks[nxt] += 1
            inside, escaped = _json_string_state(bytes((nxt,)), inside, escaped)
        return bytes(out)

    def _next_byte(self, g: Grammar, picks: list[int], in_string: bool) -> int | None:
        """Accept into `g` and return the first byte in preferred order that it takes, trying bytes
        picked fewer than 4 times in this run first. Trying one token is far cheaper than a mask fill."""
        order = self._orders[in_string]
        for fresh_only in (True, False):
            for b in order:
                if fresh_only and picks[b] >= 4:
                    continue
                if g.accept_token(self.byte_token[b]):
                    return b
        return None

    def tokens(self, grammar: Grammar, data: bytes) -> list[int] | None:
        """Token ids spelling `data` that `grammar`'s masks allow, longest token first at each point
        (a mask may be stricter than `accept_token`: llguidance allows only `,"` where `,"` is
        forced, not `,` then `"`). None if some point allows no token of `data`."""
        g = grammar.copy()
        out, pos = [], 0
        mask = allocate_bitmask(1, self.vocab_size)  # this call's own: the completer is shared across threads
        while pos < len(data):
            g.fill_bitmask(mask, 0)
            row = mask[0]
            for end in range(min(len(data), pos + self.max_token_bytes), pos, -1):
                tid = self.token_of.get(data[pos:end])
                if tid is not None and (int(row[tid >> 5]) >> (tid & 31)) & 1 and g.accept_token(tid):
                    out.append(tid)
                    pos = end
                    break
            else:
                return None
        return out


class BudgetAwareGrammar(Grammar):
    """A matcher that closes its output within the remaining budget (see the module docstring)."""

    def __init__(self, inner: Grammar, completer: ShortestCompletion, max_new_tokens: int | None = None,
                 margin: int = DEFAULT_MARGIN, window: int = DEFAULT_WINDOW) -> None:
        """With `max_new_tokens`, raise GrammarError if the shortest output found does not fit it."""
        self.inner = inner
        self.completer = completer
        self.margin = margin
        self.window = window
        self.stop_token_ids = inner.stop_token_ids
        self.max_bytes = search_bytes(max_new_tokens)  # how far the completion search goes
        self.remaining: int | None = None
        self.forced = False  # a mask was restricted to the completion
        self.overshoot = False  # the completion needed more tokens than were left
        self._out: list[bytes] = []  # bytes of each accepted token
        self._plan: list[int] | None = None  # completion tokens, valid for the current state
        if max_new_tokens is not None:
            need = self.needed()
            if need is None or need > max_new_tokens:
                found = "no completion was found" if need is None else \
                    f"the shortest output found takes {need} tokens (a stop token included)"
                raise GrammarError(f"budget_aware: {found}, which does not fit max_new_tokens={max_new_tokens}; "
                                   "raise max_new_tokens or turn budget_aware off")

    def needed(self) -> int | None:
        """Tokens the completion found from here takes, a stop token included (None: none found)."""
        if self._plan is None:
            data = self.completer.completion(self.inner, b"".join(self._out), self.max_bytes)
            self._plan = None if data is None else self.completer.tokens(self.inner, data)
        return None if self._plan is None else len(self._plan) + 1

    def set_budget(self, remaining: int) -> None:
        self.remaining = remaining

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.inner.fill_bitmask(bitmask, row)
        if self.remaining is None or self.inner.is_terminated():
            return
        need = self.needed()
        if need is None:
            return
        plan = self._plan
        self.overshoot |= need > self.remaining
        if self.remaining > need + self.margin + self.window:
            return
        first_ok = bool(plan) and bool((int(bitmask[row, plan[0] >> 5]) >> (plan[0] & 31)) & 1)
        if self.remaining <= need + self.margin:  # engaged: follow the completion
            self.forced = True
            stop_only_row(bitmask, row, () if plan else self.stop_token_ids)
        else:  # the window: nothing that opens new structure
            bitmask[row].bitwise_and_(self.completer.safe)
            if not plan:
                for tid in self.stop_token_ids:
                    set_token_bit(bitmask[row], tid, True)
        if first_ok:
            set_token_bit(bitmask[row], plan[0], True)

    def accept_token(self, token_id: int) -> bool:
        if not self.inner.accept_token(token_id):
            return False
        data = self.completer.table[token_id] if 0 <= token_id < len(self.completer.table) else None
        self._out.append(data or b"")
        plan = self._plan
        self._plan = plan[1:] if plan and plan[0] == token_id else None
        return True

    def can_terminate(self) -> bool:
        return self.inner.can_terminate()

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)
        if num_tokens:
            del self._out[-num_tokens:]
        self._plan = None

    def jump_forward(self) -> str | None:
        return self.inner.jump_forward()

    def copy(self) -> BudgetAwareGrammar:
        twin = BudgetAwareGrammar(self.inner.copy(), self.completer, margin=self.margin, window=self.window)
        twin.remaining, twin.forced, twin.overshoot = self.remaining, self.forced, self.overshoot
        twin.max_bytes = self.max_bytes
        twin._out = list(self._out)
        return twin

    def meta(self) -> dict[str, Any]:
        return self.inner.meta()
