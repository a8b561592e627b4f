"""The language's OpenAI backend against a real `radixgen serve` (chat and completion modes)."""

from __future__ import annotations

import re

import pytest

import radixgen as sgl

pytest.importorskip("openai")


@sgl.function
def chat_program(s, city):
    s += sgl.user(f"What country is {city} in? Answer with the country name only.")
    s += sgl.assistant(sgl.gen("country", max_tokens=8, temperature=0))
    s += sgl.user("Is that country in Europe?")
    s += sgl.assistant(sgl.select("europe", choices=["yes", "no"]))
    s += sgl.user("Give a four-digit year.")
    s += sgl.assistant(sgl.gen("year", regex=r"(19|20)[0-9]{2}", max_tokens=8))


@sgl.function
def completion_program(s):
    s += "Q: What is the capital of France?\nA:"
    s += sgl.gen("answer", max_tokens=6, stop="\n", temperature=0)
    s += "\nQ: Is Paris a city or a river?\nA: It is a"
    s += sgl.select("kind", choices=[" city", " river"])


def test_chat_model_program(server):
    backend = sgl.OpenAI("default", base_url=server.url + "/v1", api_key="unused")
    state = chat_program.run(city="Paris", backend=backend)
    state.sync()
    assert state["country"].strip()
    assert state["europe"] in ("yes", "no")
    assert re.fullmatch(r"(19|20)[0-9]{2}", state["year"])
    assert [m["role"] for m in state.messages()][-2:] == ["user", "assistant"]


def test_completion_model_program_scores_select(server, engine):
    backend = sgl.OpenAI("default", base_url=server.url + "/v1", api_key="unused", is_chat_model=False)
    remote = completion_program.run(backend=backend)
    remote.sync()
    local = completion_program.run(backend=engine)
    local.sync()
    assert remote["answer"] == local["answer"]  # greedy, same model, same text in
    assert remote["kind"] == local["kind"] and remote["kind"] in (" city", " river")
    assert len(remote.get_meta_info("kind")["normalized_prompt_logprobs"]) == 2
