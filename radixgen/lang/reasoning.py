"""`sgl.separate_reasoning`'s split of a finished reply into its reasoning and its answer, per model
type, as SGLang's frontend does it (its non-streaming reasoning parser, `parse_non_stream`).

- `qwen3`: the reply reasons only if it writes `<think>`; without it, all of it is the answer.
- `qwen3-thinking`, `deepseek-r1`: the reply starts inside the reasoning (their templates open the
  tag in the prompt), `<think>` or not.

Once the reply is in its reasoning, leading `<think>` tags are dropped, the reasoning runs to the
first `</think>` and the answer is everything after it, both as written (no whitespace trimmed);
with no `</think>`, all of it is reasoning and the answer is empty. The server's streaming parser
(runtime/server/parsers/reasoning.py) reads the same tags.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningTags:
    start: str = "<think>"
    end: str = "</think>"
    forced: bool = False  # the reply starts inside the reasoning


MODEL_TYPES: dict[str, ReasoningTags] = {
    "qwen3": ReasoningTags(),
    "qwen3-thinking": ReasoningTags(forced=True),
    "deepseek-r1": ReasoningTags(forced=True),
}


def reasoning_tags(model_type: str | None) -> ReasoningTags:
    """The tags of `model_type` (SGLang's names; `_` for `-` accepted), or a ValueError naming the choices."""
    if not model_type:
        raise ValueError(f"separate_reasoning needs a model_type: one of {', '.join(MODEL_TYPES)}")
    tags = MODEL_TYPES.get(model_type.lower().replace("_", "-"))
    if tags is None:
        raise ValueError(f"unsupported reasoning model_type {model_type!r}: choose one of {', '.join(MODEL_TYPES)}")
    return tags


def split_reasoning(text: str, tags: ReasoningTags) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply (see the module docstring)."""
    if not tags.forced and tags.start not in text:
        return "", text
    while text.startswith(tags.start):
        text = text[len(tags.start):]
    if tags.end not in text:
        return text, ""
    reasoning, _, answer = text.partition(tags.end)
    return reasoning, answer
