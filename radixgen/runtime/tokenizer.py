"""Tokenizer, chat template and incremental detokenizer with stop strings.

The tokenizer comes from an HF model directory or is converted from a GGUF file's metadata (slow,
~5 s) and then cached as tokenizer.json in the user cache dir (~0.3 s to load). Detokenization
follows the usual windowed scheme: decode a few tokens of left context together with the new ones
and emit only the text past the context, holding back text that ends in an incomplete UTF-8
sequence (U+FFFD) or that may be the beginning of a stop string.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixgen.runtime.models.resolve import cache_dir_for, resolve_model_path

logger = logging.getLogger(__name__)
DETOK_CONTEXT = 5  # tokens of left context used to decode a boundary correctly


class Tokenizer:
    """A thin wrapper over a HF fast tokenizer with the facts the engine needs."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        # transformers' model-specific classes keep the Python vocabulary and merges they built their
        # backend from (Gemma 3: 262k entries and 515k merges, ~0.2 GB); the backend holds both and
        # nothing reads these after construction but `save_vocabulary` of a few slow-format classes
        for name in ("_vocab", "_merges"):
            held = getattr(hf, name, None)
            if isinstance(held, dict | list) and getattr(hf, "_tokenizer", None) is not None:
                setattr(hf, name, type(held)())
        self.vocab_size = len(hf)
        eos = set()
        if hf.eos_token_id is not None:
            eos.add(int(hf.eos_token_id))
        added = getattr(hf, "added_tokens_decoder", {})
        for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "</s>", "<end_of_turn>"):
            tid = hf.convert_tokens_to_ids(name)
            special = name in hf.all_special_tokens or (tid in added and added[tid].special)
            if isinstance(tid, int) and tid != hf.unk_token_id and special:
                eos.add(tid)
        self.eos_token_ids: list[int] = sorted(eos)
        self.chat_template: str | None = getattr(hf, "chat_template", None)
        # HF's decode is its fast backend's plus a Python wrapper (~2 us a call, two calls per token of
        # every request in the detokenizer) and, where the tokenizer asks for it, a clean-up of spaces
        backend = getattr(hf, "backend_tokenizer", None)
        self._backend_decode = (backend.decode if backend is not None
                                and not getattr(hf, "clean_up_tokenization_spaces", False) else None)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._backend_decode is not None and isinstance(ids, list):
            return self._backend_decode(ids, skip_special_tokens=skip_special_tokens)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """`chat_template` (the tokenizer's, or the one set in its place) rendered over `messages`;
        `template_kwargs` are more variables for the template (e.g. Qwen3's `enable_thinking`)."""
        if not self.chat_template:
            raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
        return self.hf.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template, **template_kwargs,
        )


def load_tokenizer(model: str | os.PathLike | None = None) -> Tokenizer:
    """Load the tokenizer of `model` (None: the default SmolLM2 GGUF)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(model)
    if path.is_dir():
        return Tokenizer(AutoTokenizer.from_pretrained(str(path)))
    tok = Tokenizer(_gguf_tokenizer(path))
    if tok.chat_template is None:  # a GGUF without one: the template its architecture is trained on, if known
        from radixgen.runtime.models.loader import gguf_reader
        from radixgen.runtime.server.chat_templates import template_for_arch

        tok.chat_template = template_for_arch(gguf_reader(path).get("general.architecture"))
    return tok


def _gguf_tokenizer(path: os.PathLike) -> Any:
    """The HF tokenizer converted from GGUF file `path` (cached after the first conversion)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cached = cache_dir_for(path) / "tokenizer"
    if (cached / "tokenizer.json").is_file():
        # the saved tokenizer.json is the whole tokenizer: the generic fast class reads it as the model's
        # own class would, without first building a Python vocabulary and merge list from it (Gemma 3:
        # 0.47 GB held after loading, and 0.1 GB of the load's peak)
        hf = PreTrainedTokenizerFast.from_pretrained(str(cached))
        if not _lists_added_tokens(cached):  # a cache written before it did: once more, then never again
            try:
                _list_added_tokens(cached, hf)
            except OSError as e:  # a read-only cache still loads, only slower
                logger.warning("could not update the cached tokenizer in %s: %s", cached, e)
        return hf
    logger.info("converting the tokenizer of %s (first load of this file, ~10 s; cached in %s)", path.name, cached)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tmp = cached.with_name(f"tokenizer.tmp{os.getpid()}")
    hf.save_pretrained(str(tmp))
    _list_added_tokens(tmp, hf)
    try:
        os.replace(tmp, cached)
    except OSError:  # another process won the race; its copy is as good as ours
        pass
    return hf


def _lists_added_tokens(saved: Path) -> bool:
    """Whether the tokenizer saved in `saved` lists its added tokens in tokenizer_config.json (True where it
    has no such file: nothing to complete)."""
    config = saved / "tokenizer_config.json"
    return not config.is_file() or "added_tokens_decoder" in json.loads(config.read_text(encoding="utf-8"))


def _list_added_tokens(saved: Path, hf: Any) -> None:
    """Write `hf`'s added tokens into the tokenizer_config.json saved in `saved`. transformers' save leaves
    them to tokenizer.json alone, and its load then parses the whole tokenizer.json in Python to find them
    (Gemma 3's 33 MB: 0.6 s and 0.2 GB of the load's peak); listed in the config, it reads them there."""
    config_path = saved / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["added_tokens_decoder"] = {str(i): t.__getstate__() for i, t in hf.added_tokens_decoder.items()}
    tmp = config_path.with_name(f"{config_path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(config, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, config_path)


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of output ids into text deltas; stops on stop strings.

    `prompt_tail` gives left context (last prompt tokens) so the first output token decodes with
    its leading space. `stop` strings are searched across token boundaries; the text returned never
    contains a stop string nor a partial UTF-8 character, and text that might begin a stop string is
    held back until it is known not to.
    """

    tokenizer: Tokenizer
    prompt_tail: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    skip_special_tokens: bool = True
    ids: list[int] = field(init=False)
    text: str = field(init=False, default="")  # all decoded text (may include a held-back tail)
    emitted: int = field(init=False, default=0)  # chars of `text` already handed out
    stopped: bool = field(init=False, default=False)
    matched_stop: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.ids = list(self.prompt_tail[-DETOK_CONTEXT:])
        self._prefix_offset = 0
        self._read_offset = len(self.ids)
        self._max_stop = max((len(s) for s in self.stop), default=0)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int]) -> str:
        """Append new ids; return the text that is now safe to emit."""
        if self.stopped:
            return ""
        self.ids.extend(token_ids)
        prefix_text = self._decode(self.ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            start = len(self.text)
            self.text += new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
            if self.stop:
                self._check_stop(start)
        return self._take()

    def replace_tail(self, drop: int, new_ids: list[int], text: str) -> str:
        """Jump-forward: the last `drop` ids become `new_ids`, whose text adds `text` to the output.

        Returns the text now safe to emit (as `add` does).
        """
        if self.stopped:
            return ""
        self.ids = self.ids[: len(self.ids) - drop] + list(new_ids)
        self._prefix_offset = max(0, len(self.ids) - DETOK_CONTEXT)
        self._read_offset = len(self.ids)
        start = len(self.text)
        self.text += text
        if self.stop:
            self._check_stop(start)
        return self._take()

    def _check_stop(self, start: int) -> None:
        lo = max(0, start - self._max_stop + 1)
        best = None
        for s in self.stop:
            i = self.text.find(s, lo)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            self.text = self.text[: best[0]]
            self.stopped, self.matched_stop = True, best[1]

    def _held_back(self) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        if self.stopped or not self.stop:
            return 0
        tail = self.text[-self._max_stop :]
        for k in range(min(len(tail), self._max_stop), 0, -1):
            suffix = tail[-k:]
            if any(s.startswith(suffix) and s != suffix for s in self.stop):
                return k
        return 0

    def _take(self) -> str:
        end = len(self.text) - self._held_back()
        out = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return out

    def flush(self) -> str:
        """At the end of generation: release any held-back text."""
        out = self.text[self.emitted :]
        self.emitted = len(self.text)
        return out

    @property
    def output_text(self) -> str:
        return self.text
