"""`sgl.separate_reasoning` in programs, checked as SGLang's frontend defines it: the variable keeps the
answer, `<name>_reasoning_content` gets the reasoning, and the reasoning leaves the program's text.

The replies are pinned by a regex (greedy, so deterministic) on the session's SmolLM2 engine; the oracle
is the same program without separate_reasoning, its raw reply split by a regex here.
"""

from __future__ import annotations

import re

import pytest

import radixgen as sgl

THINKING = r"<think>[a-z]{2,8}( [a-z]{2,8}){1,3}</think>\n\n(yes|no)"
NO_OPEN_TAG = r"[a-z]{2,8}( [a-z]{2,8}){1,2}</think>(yes|no)"


@sgl.function
def ask(s, pattern, model_type=None):
    s += sgl.user("Is the sky blue? Think first.")
    answer = sgl.gen("answer", max_tokens=40, regex=pattern)
    s += sgl.assistant(sgl.separate_reasoning(answer, model_type=model_type) if model_type else answer)


def raw_reply(backend, pattern) -> str:
    return ask.run(pattern=pattern, temperature=0, backend=backend)["answer"]


def raw_text(backend) -> str:
    return ask.run(pattern=THINKING, temperature=0, backend=backend).text()


def test_reasoning_is_split_into_its_own_variable(backend):
    raw = raw_reply(backend, THINKING)
    reasoning, answer = re.fullmatch(r"<think>(.*)</think>(.*)", raw, re.S).groups()
    s = ask.run(pattern=THINKING, model_type="qwen3", temperature=0, backend=backend)
    assert s["answer"] == answer and answer.strip() in ("yes", "no")
    assert s["answer_reasoning_content"] == reasoning
    assert s.text() == raw_text(backend).replace(raw, answer)  # the reasoning left the text too
    assert s.messages()[-1] == {"role": "assistant", "content": answer}


def test_model_types_that_start_inside_the_reasoning(backend):
    raw = raw_reply(backend, NO_OPEN_TAG)  # DeepSeek-R1's templates open the tag in the prompt
    reasoning, answer = raw.split("</think>")
    s = ask.run(pattern=NO_OPEN_TAG, model_type="deepseek-r1", temperature=0, backend=backend)
    assert (s["answer_reasoning_content"], s["answer"]) == (reasoning, answer)
    plain = ask.run(pattern=NO_OPEN_TAG, model_type="qwen3", temperature=0, backend=backend)
    assert (plain["answer_reasoning_content"], plain["answer"]) == ("", raw)  # qwen3 reasons only after <think>


def test_streamed_programs_are_left_alone_and_bad_uses_are_refused(backend):
    s = ask.run(pattern=THINKING, model_type="qwen3", temperature=0, backend=backend, stream=True)
    assert "".join(s.text_iter("answer")).startswith("<think>")  # SGLang skips the split when streaming
    s.sync()
    assert s["answer"].startswith("<think>") and "answer_reasoning_content" not in s
    with pytest.raises(KeyError):
        s["answer_reasoning_content"]
    with pytest.raises(ValueError, match="model_type"):
        sgl.separate_reasoning(sgl.gen("x"), model_type="no-such-model")
    with pytest.raises(ValueError, match="name"):
        sgl.separate_reasoning(sgl.gen(), model_type="qwen3")
