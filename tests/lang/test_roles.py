"""Role begin/end strings derived from the real SmolLM2 chat template."""

import pytest

from radixgen.lang import ir
from radixgen.lang.backends.base import ChatTemplate

SMOL_DEFAULT = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def tok():
    from radixgen.runtime.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def template(tok):
    return ChatTemplate.from_apply(lambda m, g: tok.apply_chat_template(m, add_generation_prompt=g))


def render(template, turns):
    out = ""
    for i, (role, content) in enumerate(turns):
        out += template.begin(role, first=i == 0) + content + template.end(role)
    return out


@pytest.mark.parametrize("turns", [
    [("user", "Hi"), ("assistant", "Hello"), ("user", "Bye")],
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello")],
    [("assistant", "I start.")],
])
def test_roles_render_like_the_template(tok, template, turns):
    messages = [{"role": r, "content": c} for r, c in turns]
    assert render(template, turns) == tok.apply_chat_template(messages, add_generation_prompt=False)


def test_default_system_prompt_and_stop(template):
    assert template.default_system == SMOL_DEFAULT
    assert template.begin("user", first=True) == SMOL_DEFAULT + "<|im_start|>user\n"
    assert template.begin("user", first=False) == "<|im_start|>user\n"
    assert template.begin("system", first=True) == "<|im_start|>system\n"
    assert template.stop_str == "<|im_end|>"
    assert ChatTemplate.chatml().default_system == ""


def test_role_expressions():
    e = ir.role_expr("user", "hi" + ir.Gen("x"))
    assert [type(x).__name__ for x in ir.flatten(e)] == ["RoleBegin", "ConstantText", "Gen", "RoleEnd"]
    with pytest.raises(TypeError, match="cannot append a int"):
        ir.to_expr(3)
