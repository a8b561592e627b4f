"""Incremental detokenizer: multi-byte characters split across tokens, stop strings across tokens."""

from __future__ import annotations

import random

import pytest

from radixgen.runtime.tokenizer import IncrementalDetokenizer, load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def run(tok, text: str, stop=()) -> tuple[list[str], IncrementalDetokenizer]:
    d = IncrementalDetokenizer(tok, [], list(stop))
    parts = [d.add([t]) for t in tok.encode(text, add_special_tokens=False)]
    parts.append(d.flush())
    return parts, d


def test_decode_equals_hf_decode(tok):
    """Our decode (the fast backend's, called directly) equals the HF tokenizer's own on random ids,
    special tokens among them, with and without skipping them."""
    rng = random.Random(0)
    specials = tok.hf.all_special_ids
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(0, 12))] + rng.sample(specials, 1)
        rng.shuffle(ids)
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == tok.hf.decode(ids, skip_special_tokens=skip)


def test_multibyte_characters_never_broken(tok):
    text = "naïve café — 日本語のテキスト 🙂👍🏽 done"
    ids = tok.encode(text, add_special_tokens=False)
    # at least one character really is split across tokens
    assert any("\ufffd" in tok.decode([t]) for t in ids)
    parts, _ = run(tok, text)
    assert "".join(parts) == text
    assert all("\ufffd" not in p for p in parts)


@pytest.mark.parametrize("stop", ["STOP", "ab STOP", "日本", "🙂"])
def test_stop_string_across_tokens(tok, stop):
    text = "xyz ab STOP the rest 日本 🙂"
    parts, d = run(tok, text, [stop])
    assert d.stopped and d.matched_stop == stop
    assert "".join(parts) == text[: text.index(stop)]
    assert all(stop not in p for p in parts)


def test_held_back_prefix_released_when_not_a_stop(tok):
    parts, d = run(tok, "the value is STO and more", ["STOP"])
    assert not d.stopped and "".join(parts) == "the value is STO and more"


def test_leading_space_with_prompt_context(tok):
    prompt = tok.encode("Hello", add_special_tokens=False)
    out = tok.encode(" world", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, prompt, [])
    assert "".join(d.add([t]) for t in out) + d.flush() == " world"
