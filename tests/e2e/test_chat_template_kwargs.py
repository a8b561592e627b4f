"""`chat_template_kwargs`, `--chat-template` and `--default-chat-template-kwargs` on chat completions.

The template is Qwen3's thinking switch (its generation prompt closes an empty think block when
`enable_thinking` is false), given to the server as a Jinja file. The oracle for the prompt the model
is sent is HF transformers rendering the same template with the same variables: the official
`openai` client (over the app in this process, httpx's ASGI transport) must be billed exactly its
tokens.
"""

from __future__ import annotations

import asyncio

import pytest

from radixgen.runtime.cli import build_parser
from radixgen.runtime.config_flags import config_kwargs
from radixgen.runtime.engine import Engine
from radixgen.runtime.server import create_app
from radixgen.runtime.server.chat_prompt import render
from radixgen.runtime.server.chat_templates import KNOWN_TEMPLATES
from radixgen.runtime.server.options import ServerOptions

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

QWEN3_STYLE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")
MSGS = [{"role": "user", "content": "Is the sky blue?"}]


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "qwen3_style.jinja"
    path.write_text(QWEN3_STYLE)
    return path


@pytest.fixture(scope="module")
def tiny_engine(tiny_models):
    eng = Engine(model=str(tiny_models["llama"]), context_length=512, max_total_tokens=2048)
    yield eng
    eng.shutdown()


def hf_prompt_ids(tiny_models, **kwargs) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_models["llama"]))
    text = tok.apply_chat_template(MSGS, chat_template=QWEN3_STYLE, add_generation_prompt=True, tokenize=False,
                                   **kwargs)
    return tok.encode(text, add_special_tokens=False)


def test_the_flags_reach_the_server_options(template_file):
    args = build_parser().parse_args(["serve", "--chat-template", str(template_file),
                                      "--default-chat-template-kwargs", '{"enable_thinking": false}'])
    options = ServerOptions(**config_kwargs(args, ServerOptions))
    assert options.template_kwargs() == {"enable_thinking": False}
    assert ServerOptions(chat_template="chatml").chat_template == "chatml"
    for bad in ({"chat_template": "no-such-template"}, {"default_chat_template_kwargs": "[1]"},
                {"default_chat_template_kwargs": "{not json"}):
        with pytest.raises(ValueError, match="chat_template|chat template"):
            ServerOptions(**bad)


def test_enable_thinking_false_changes_the_prompt_sent(tiny_engine, tiny_models, template_file):
    app = create_app(tiny_engine, model_name="tiny", options=ServerOptions(chat_template=str(template_file)))
    state = app.state.radixgen
    thinking, off = render(state, MSGS, None), render(state, MSGS, None, {"enable_thinking": False})
    assert off == thinking + "<think>\n\n</think>\n\n"
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tiny")
    client = openai.AsyncOpenAI(base_url="http://tiny/v1", api_key="unused", http_client=http, max_retries=0)

    async def prompt_tokens(**kw) -> int:
        out = await client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1, **kw)
        return out.usage.prompt_tokens

    async def run() -> None:
        assert await prompt_tokens() == len(hf_prompt_ids(tiny_models))
        off_ids = hf_prompt_ids(tiny_models, enable_thinking=False)
        assert await prompt_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": False}}) == len(off_ids)
        assert len(off_ids) > len(hf_prompt_ids(tiny_models))
        with pytest.raises(openai.BadRequestError, match="tokenize"):
            await prompt_tokens(extra_body={"chat_template_kwargs": {"tokenize": True}})

    asyncio.run(run())
    # the server's default variables apply to every request; a request's own override them
    defaults = create_app(tiny_engine, model_name="tiny", options=ServerOptions(
        chat_template=str(template_file), default_chat_template_kwargs='{"enable_thinking": false}')).state.radixgen
    assert render(defaults, MSGS, None) == off
    assert render(defaults, MSGS, None, {"enable_thinking": True}) == thinking


def test_known_templates_render_their_formats(tiny_engine):
    state = create_app(tiny_engine, model_name="tiny", options=ServerOptions(chat_template="llama-3-instruct")
                       ).state.radixgen
    assert render(state, MSGS, None).endswith(
        "<|start_header_id|>user<|end_header_id|>\n\nIs the sky blue?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    tiny_engine.tokenizer.chat_template = KNOWN_TEMPLATES["chatml"]
    assert render(state, MSGS, None) == "<|im_start|>user\nIs the sky blue?<|im_end|>\n<|im_start|>assistant\n"
