"""Programs from SGLang's test/test_programs.py, run the way upstream's test_srt_backend.py runs them:
one `sgl.Runtime()` (a `radixgen serve` child process, the default SmolLM2) set as the default
backend, and each program written as in SGLang (only the import differs).

Ported: test_stream_logprobs (each streamed chunk carries its own tokens' logprobs and the running
`output_token_logprobs_length`) and test_gen_min_new_tokens (the default backend stays the Runtime,
so `global_config.default_backend.endpoint` reaches the server). The stream check also runs on an
in-process Engine as the default backend.
"""

from __future__ import annotations

import asyncio

import pytest

import radixgen as sgl
from radixgen.runtime.tokenizer import load_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def runtime():
    rt = sgl.Runtime(num_threads=1, skip_warmup=True)  # as upstream's setUpClass: the default backend
    sgl.set_default_backend(rt)
    try:
        yield rt
    finally:
        sgl.set_default_backend(None)
        rt.shutdown()


@pytest.fixture(params=["runtime", "engine"])
def default_backend(request, runtime):
    """The Runtime as the default backend, or for a while the session's in-process Engine."""
    if request.param == "engine":
        sgl.set_default_backend(request.getfixturevalue("engine"))
    try:
        yield request.param
    finally:
        sgl.set_default_backend(runtime)


def test_stream_logprobs(default_backend):
    @sgl.function
    def qa(s, question):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", return_logprob=True))

    async def chunks_of_the_answer() -> list[tuple[str, dict]]:
        state = qa(question="Write a short travel blog post about a trip to Hawaii: its culture and sights.",
                   stream=True, temperature=0, max_new_tokens=64)
        return [chunk async for chunk in state.text_async_iter("answer", return_meta_data=True)]

    chunks = asyncio.run(chunks_of_the_answer())
    assert len(chunks) > 1
    tokens_before = 0
    for text, meta in chunks:
        assert text
        assert "output_token_logprobs" in meta and "output_token_logprobs_length" in meta
        assert meta["output_token_logprobs_length"] == meta["completion_tokens"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - tokens_before
        tokens_before = meta["output_token_logprobs_length"]
    assert tokens_before > 16


def test_gen_min_new_tokens(runtime):
    assert sgl.global_config.default_backend is runtime
    model_path = sgl.global_config.default_backend.endpoint.get_model_name()
    min_tokens, max_tokens = 64, 128

    @sgl.function
    def convo(s):
        s += sgl.user("What is the capital of the United States?")
        s += sgl.assistant(sgl.gen("answer", min_tokens=min_tokens, max_tokens=max_tokens))

    tokenizer = load_tokenizer(model_path)
    answer = convo.run(temperature=0)["answer"]  # greedy (upstream samples): the same answer every run
    assert len(tokenizer.encode(answer)) >= min_tokens, answer
