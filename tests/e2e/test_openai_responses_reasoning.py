"""Reasoning items of /v1/responses, in process: the app with `--reasoning-parser qwen3` and an API key
over a tiny random model (SmolLM2 tokenizer) whose chat template opens a `<think>` block, driven by the
official openai client through httpx's ASGI transport. A regex extension pins what the random model
writes (greedy); the oracle is chat completions' `reasoning_content` / `content` for the same request."""

from __future__ import annotations

import asyncio
import shutil
from itertools import groupby

import pytest

from radixgen.runtime.server import create_app

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
ASK = "Is the sky blue?"
THINKING = r"[a-z]{2,8}( [a-z]{2,8}){1,3}\n</think>\n\n(yes|no)"  # a few words of reasoning, then the answer


@pytest.fixture(scope="module")
def client(tiny_models, tmp_path_factory):
    from transformers import AutoTokenizer

    from radixgen.runtime.engine import Engine

    model = tmp_path_factory.mktemp("think") / "model"
    shutil.copytree(tiny_models["qwen2"], model)
    tok = AutoTokenizer.from_pretrained(str(model))
    tok.chat_template = THINK_TEMPLATE
    tok.save_pretrained(str(model))
    engine = Engine(model=str(model), context_length=1024, max_total_tokens=4096)
    app = create_app(engine, api_key="sekrit", model_name="tiny", reasoning_parser="qwen3")
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tiny")
    yield openai.AsyncOpenAI(base_url="http://tiny/v1", api_key="sekrit", http_client=http, max_retries=0)
    engine.shutdown()


def test_reasoning_is_its_own_item_streamed_or_not(client):
    kw = dict(model="tiny", temperature=0, extra_body={"regex": THINKING})

    async def run() -> None:
        want = (await client.chat.completions.create(messages=[{"role": "user", "content": ASK}], max_tokens=40,
                                                     **kw)).choices[0].message
        r = await client.responses.create(input=ASK, max_output_tokens=40, **kw)
        reasoning, message = r.output
        assert (reasoning.type, message.type) == ("reasoning", "message")
        assert (reasoning.content[0].text, message.content[0].text) == (want.reasoning_content, want.content)
        assert message.content[0].text in ("yes", "no") and r.usage.output_tokens_details.reasoning_tokens > 0
        assert (await client.responses.retrieve(r.id)).output_text == r.output_text  # stored under the key

        events = [e async for e in await client.responses.create(input=ASK, max_output_tokens=40, stream=True, **kw)]
        assert [k for k, _ in groupby(e.type for e in events)] == [
            "response.created", "response.in_progress",
            "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
            "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
            "response.output_item.added", "response.content_part.added", "response.output_text.delta",
            "response.output_text.done", "response.content_part.done", "response.output_item.done",
            "response.completed"]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        assert thought == want.reasoning_content and events[-1].response.output_text == want.content

    asyncio.run(run())
