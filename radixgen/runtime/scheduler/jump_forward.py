"""Jump-forward decoding: append the continuation a grammar forces without sampling it.

When a request's grammar admits exactly one continuation string (e.g. `"name":"` after `{` for a
fixed schema), the scheduler appends it in one go. The output's last few tokens plus the forced
string are re-tokenized together so the boundary gets the tokens the model would have seen
(e.g. `":` rather than `"` + `:`), the grammar is moved onto the new tokens, and the KV computed
for any replaced token is dropped; the next step extends over all new tokens at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.runtime.scheduler.request import Req

JUMP_TAIL_TOKENS = 4  # output tokens re-tokenized together with the forced string


@dataclass
class Jump:
    keep: int  # output tokens kept unchanged
    new_tail: list[int]  # tokens replacing output_ids[keep:]
    text: str  # the forced text


def plan_jump(req: Req) -> Jump | None:
    """A jump for `req` if its grammar forces text and the re-tokenization is lossless, else None.

    On success the grammar has already been moved onto the new tokens (`jump_and_retokenize`).
    """
    forced = req.grammar.jump_forward()
    if not forced:
        return None
    tok = req.detok.tokenizer
    out = req.output_ids
    tree_owned = max(req.kv.locked_len - len(req.input_ids), 0)  # output tokens whose KV the tree holds
    start = max(len(out) - JUMP_TAIL_TOKENS, tree_owned, 0)
    tail = out[start:]
    tail_text = tok.decode(tail, skip_special_tokens=False)
    new = tok.encode(tail_text + forced, add_special_tokens=False)
    if tok.decode(new, skip_special_tokens=False) != tail_text + forced:
        return None
    if start + len(new) > req.params.max_new_tokens:
        return None
    if not req.grammar.jump_and_retokenize(tail, new):
        return None
    common = 0
    while common < min(len(tail), len(new)) and tail[common] == new[common]:
        common += 1
    return Jump(start + common, new[common:], forced)
