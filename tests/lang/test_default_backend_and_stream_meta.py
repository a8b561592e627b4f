"""SGLang's frontend behaviours that need no model: the default backend is kept as the user gave it,
and streamed chunks carry their own tokens' logprobs (a scripted backend stands in for the engine).

The same behaviours on the real model, through sgl.Runtime: tests/e2e/test_sglang_srt_backend.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import radixgen as sgl
from radixgen.lang.backends.base import Backend


class ScriptedBackend(Backend):
    """Streams fixed chunks as the engine reports them: meta info so far, with its per-token lists
    shared with the request, which may already hold later tokens' entries when a chunk is read."""

    def __init__(self, chunks: list[tuple[str, int]], overshoot: int = 0) -> None:
        self.chunks, self.overshoot = chunks, overshoot  # (delta text, completion tokens so far)

    def get_model_name(self) -> str:
        return "scripted"

    def _meta(self, tokens: int, finished: bool, logprobs: list, tops: list) -> dict:
        return {"prompt_tokens": 3, "cached_tokens": 0, "completion_tokens": tokens,
                "finish_reason": {"type": "length"} if finished else None,
                "output_token_logprobs": logprobs, "output_top_logprobs": tops}

    def generate_stream(self, ctx, params) -> Iterator[tuple[str, dict | None]]:
        logprobs: list = []  # one list for the whole request, as the engine's Req keeps it
        tops: list = []
        total = self.chunks[-1][1]
        for i, (text, tokens) in enumerate(self.chunks):
            ahead = min(tokens + self.overshoot, total)
            while len(logprobs) < ahead:  # the request moved on before this chunk was read
                k = len(logprobs)
                logprobs.append((-0.1 * (k + 1), 100 + k))
                tops.append([(-0.1 * (k + 1), 100 + k)])
            yield text, self._meta(tokens, i == len(self.chunks) - 1, logprobs, tops)

    def generate(self, ctx, params) -> tuple[str, dict]:
        text, last = "", {}
        for delta, meta in self.generate_stream(ctx, params):
            text, last = text + delta, meta
        return text, last


class FakeRuntime:
    """What sgl.Runtime is to the frontend: an object whose `.endpoint` is the backend."""

    def __init__(self, endpoint: Backend) -> None:
        self.endpoint = endpoint


@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", return_logprob=True, top_logprobs_num=1))


@pytest.fixture(autouse=True)
def _no_default_backend():
    yield
    sgl.set_default_backend(None)


def test_the_default_backend_is_kept_as_given():
    scripted = ScriptedBackend([("Hello", 1), (" world", 3)])
    runtime = FakeRuntime(scripted)
    sgl.set_default_backend(runtime)
    assert sgl.get_default_backend() is runtime and sgl.global_config.default_backend is runtime
    assert sgl.global_config.default_backend.endpoint.get_model_name() == "scripted"
    assert qa.run(question="Hi?")["answer"] == "Hello world"  # programs run on its endpoint
    sgl.global_config.default_backend = scripted
    assert sgl.get_default_backend() is scripted
    with pytest.raises(TypeError, match="not a backend"):
        sgl.set_default_backend(object())
    assert sgl.get_default_backend() is scripted  # a refused object leaves the default as it was
    sgl.set_default_backend(None)
    assert sgl.get_default_backend() is None
    with pytest.raises(ValueError, match="no backend"):
        qa.run(question="Hi?")


@pytest.mark.parametrize("overshoot", [0, 2])
def test_each_streamed_chunk_carries_its_own_tokens_logprobs(overshoot):
    # the third chunk's tokens decode to no text yet: their logprobs come with the next text
    backend = ScriptedBackend([("Hel", 1), ("lo", 2), ("", 4), (" there", 5), ("!", 7)], overshoot)
    sgl.set_default_backend(backend)

    async def collect() -> list[tuple[str, dict]]:
        state = qa.run(question="Hi?", stream=True)
        return [item async for item in state.text_async_iter("answer", return_meta_data=True)]

    chunks = asyncio.run(collect())
    assert "".join(text for text, _ in chunks) == "Hello there!"
    seen = 0
    for text, meta in chunks:
        assert text and meta["output_token_logprobs_length"] == meta["completion_tokens"]
        assert len(meta["output_token_logprobs"]) == len(meta["output_top_logprobs"]) \
            == meta["completion_tokens"] - seen
        assert [tid for _, tid in meta["output_token_logprobs"]] == list(range(100 + seen, 100 + seen + len(
            meta["output_token_logprobs"])))
        seen = meta["completion_tokens"]
    assert seen == 7 and chunks[-1][1]["finish_reason"] == {"type": "length"}
    state = qa.run(question="Hi?", stream=True)
    state.sync()
    assert len(state.get_meta_info("answer")["output_token_logprobs"]) == 7  # the whole gen's, once done


class _NoLogprobs(ScriptedBackend):
    """Reports no logprobs, as a backend does for a gen that asked for none."""

    def _meta(self, tokens: int, finished: bool, logprobs: list, tops: list) -> dict:
        meta = super()._meta(tokens, finished, logprobs, tops)
        del meta["output_token_logprobs"], meta["output_top_logprobs"]
        return meta


def test_chunks_without_logprobs_get_no_logprob_fields():
    @sgl.function
    def plain(s):
        s += "Say hello." + sgl.gen("answer")

    sgl.set_default_backend(_NoLogprobs([("Hi", 1), ("!", 2)]))
    items = list(plain.run(stream=True).text_iter("answer", return_meta_data=True))
    assert "".join(text for text, _ in items) == "Hi!"
    assert all("output_token_logprobs_length" not in meta and "output_token_logprobs" not in meta
               for _, meta in items)
    assert items[-1][1]["completion_tokens"] == 2
