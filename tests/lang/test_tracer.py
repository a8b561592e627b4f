"""Tracing with placeholder arguments: the f-string error and the constant prefix for run_batch."""

import pytest

import radixgen as sgl
from radixgen.lang.backends.base import ChatTemplate
from radixgen.lang.tracer import Placeholder, extract_prefix


@sgl.function
def few_shot(s, question):
    s += "Q: 1+1?\nA: 2\n"
    s += "Q: " + question + "\nA:"
    s += sgl.gen("answer", max_tokens=8)


@sgl.function
def chat(s, question):
    s += sgl.system("Be brief.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer"))


def test_fstring_and_concat_of_placeholder_raise_type_error():
    @sgl.function
    def bad(s, question):
        s += f"Q: {question}"

    with pytest.raises(TypeError, match="placeholder.*f-string"):
        bad.trace()
    with pytest.raises(TypeError, match="str concatenation"):
        few_shot.trace()
    with pytest.raises(TypeError, match="str\\(\\)"):
        str(Placeholder("x"))


def test_trace_records_nodes_and_prefix():
    @sgl.function
    def good(s, question):
        s += "Q: "
        s += question
        s += "\nA:" + sgl.gen("answer")

    t = good.trace()
    assert t.prefix == "Q: "
    assert [type(n).__name__ for n in t.nodes] == ["ConstantText", "Placeholder", "ConstantText", "Gen"]
    assert good.trace(question="Why?").prefix == "Q: Why?\nA:"


def test_extract_prefix_keeps_text_before_the_first_placeholder_use():
    assert extract_prefix(few_shot.func, {}, None) == "Q: 1+1?\nA: 2\n"
    tpl = ChatTemplate.chatml()
    assert extract_prefix(chat.func, {}, tpl) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    assert extract_prefix(chat.func, {}, None) == ""  # roles need a template
