"""Reasoning and the other tool-call formats, on a tiny random model (SmolLM2 tokenizer) whose chat
template opens a `<think>` block, like Qwen3's and DeepSeek-R1's thinking templates.

What a random model writes is pinned down with a regex extension (greedy, so deterministic), and the
official `openai` client reads it: from a real `radixgen serve --reasoning-parser qwen3`, and, for the
hermes / llama3_json tool-call formats, from the app in this process (httpx's ASGI transport), whose
engine also compiles the constraint a reasoning request gets, to check it on literal replies.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil

import pytest

from radixgen.grammar import spec_from_params
from radixgen.runtime.server import create_app
from radixgen.runtime.server.chat_prompt import constraint, tool_setup
from radixgen.runtime.server.parsers import REASONING_FORMATS
from radixgen.runtime.server.protocol import ChatCompletionRequest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
ASK = [{"role": "user", "content": "Is the sky blue?"}]
# a reply starting inside the reasoning: a few words, the end tag, then the answer
THINKING = r"[a-z]{2,8}( [a-z]{2,8}){1,3}\n</think>\n\n(yes|no)"


@pytest.fixture(scope="module")
def think_model(tiny_models, tmp_path_factory):
    """The tiny qwen2 model with a thinking chat template."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("think") / "model"
    shutil.copytree(tiny_models["qwen2"], out)
    tok = AutoTokenizer.from_pretrained(str(out))
    tok.chat_template = THINK_TEMPLATE
    tok.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def think_server(think_model, start_server):
    return start_server("--model", str(think_model), "--reasoning-parser", "qwen3", "--served-model-name", "tiny",
                        "--max-total-tokens", "4096", "--num-threads", "1")


def prompt_ids(model_dir, messages) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<think>\n")
    return tok.encode(text, add_special_tokens=False)


def test_reasoning_content_is_split_off_streamed_or_not(think_server, think_model):
    client = openai.OpenAI(base_url=think_server.url + "/v1", api_key="unused", max_retries=0)
    kw = dict(model="tiny", messages=ASK, temperature=0, max_tokens=40, extra_body={"regex": THINKING})
    # oracle: the same prompt and constraint through the native endpoint, split with a regex
    status, raw = think_server.post("/generate", {"input_ids": prompt_ids(think_model, ASK), "sampling_params": {
        "regex": THINKING, "temperature": 0, "max_new_tokens": 40}})
    assert status == 200
    want_reasoning, want_content = re.fullmatch(r"(.*)</think>\s*(.*)", raw["text"], re.S).groups()
    full = client.chat.completions.create(**kw)
    msg = full.choices[0].message
    assert (msg.reasoning_content, msg.content) == (want_reasoning, want_content)
    assert msg.content in ("yes", "no") and full.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    kinds = [("r", d.reasoning_content) if getattr(d, "reasoning_content", None) else ("c", d.content)
             for d in deltas if getattr(d, "reasoning_content", None) or d.content]
    assert "".join(t for k, t in kinds if k == "r") == want_reasoning
    assert "".join(t for k, t in kinds if k == "c") == want_content
    assert sum(k == "r" for k, _ in kinds) > 1  # reasoning streamed as generated
    order = "".join(k for k, _ in kinds)
    assert order == "r" * order.count("r") + "c" * order.count("c")  # all reasoning before any content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_response_format_applies_after_the_reasoning(think_server):
    client = openai.OpenAI(base_url=think_server.url + "/v1", api_key="unused", max_retries=0)
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    kw = dict(model="tiny", messages=ASK, temperature=0, max_tokens=6, response_format=rf)
    full = client.chat.completions.create(**kw)
    streamed = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or ""
                       for ch in client.chat.completions.create(stream=True, **kw) if ch.choices)
    # a random model does not end its reasoning in 6 tokens: all of it is reasoning, none of it JSON
    assert full.choices[0].finish_reason == "length" and not full.choices[0].message.content
    assert full.choices[0].message.reasoning_content == streamed and not streamed.lstrip().startswith("{")


# ---------------------------------------------------------------------------------------------- in process


@pytest.fixture(scope="module")
def think_engine(think_model):
    from radixgen.runtime.engine import Engine

    eng = Engine(model=str(think_model), context_length=1024, max_total_tokens=4096)
    yield eng
    eng.shutdown()


def asgi_client(app):
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tiny")
    return openai.AsyncOpenAI(base_url="http://tiny/v1", api_key="unused", http_client=http, max_retries=0)


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_the_reasoning_constraint_frees_the_reasoning_and_holds_the_answer(think_engine):
    state = create_app(think_engine, model_name="tiny").state.radixgen
    req = ChatCompletionRequest(messages=ASK, response_format={"type": "json_schema", "json_schema": {
        "name": "p", "schema": PERSON, "strict": True}})
    params, param = constraint(state, req, {}, tool_setup(state, req), (REASONING_FORMATS["qwen3"], "open"))
    assert param == "response_format"
    backend = think_engine.grammar_cache.backend
    compiled = backend.compile(spec_from_params(**params))
    tok = think_engine.tokenizer
    eos = tok.eos_token_ids[0]

    def accepts(text: str) -> bool:
        g = backend.matcher(compiled)
        return all(g.accept_token(t) for t in tok.encode(text, add_special_tokens=False)) and g.accept_token(eos)

    assert accepts('so {not: json} </thin\n</think>\n\n{"name": "Al", "age": 3}')
    assert accepts('</think>{"name":"Bo","age":40}')
    assert not accepts('hmm</think>\n\n{"name": "Al"}')  # the answer must match the schema
    assert not accepts('hmm</think>\n\nyes')
    assert not accepts('hmm')  # the reasoning must end


FORMATS_REPLIES = {  # a free-format reply in each format, some text before the calls (hermes)
    "hermes": 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "(Paris|Rome)"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "(Paris|Rome)"}}; '
                   '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"],
    "additionalProperties": False}}}


def regex_of(text: str) -> str:
    """A regex matching `text`, whose `(a|b)` groups stay alternatives."""
    return re.sub(r"([.\[\]{}*+?^$\\])", r"\\\1", text)


@pytest.mark.parametrize("fmt", list(FORMATS_REPLIES))
def test_tool_call_formats_stream_and_fold_alike(think_engine, fmt):
    client = asgi_client(create_app(think_engine, model_name="tiny", tool_call_parser=fmt))
    msgs = [{"role": "user", "content": "Weather in Paris and Oslo?"}]

    async def both(**kw) -> tuple:
        kw = dict(model="tiny", messages=msgs, tools=[WEATHER], temperature=0, max_tokens=120, **kw)
        full = await client.chat.completions.create(**kw)
        chunks = [ch async for ch in await client.chat.completions.create(stream=True, **kw)]
        return full, chunks

    async def run() -> None:
        # one forced call (a random model might go on calling until max_tokens cuts a call short), and the
        # free-format reply pinned by a regex
        forced = {"tool_choice": "required", "parallel_tool_calls": False}
        for kw in (forced, {"extra_body": {"regex": regex_of(FORMATS_REPLIES[fmt])}}):
            full, chunks = await both(**kw)
            msg = full.choices[0].message
            assert full.choices[0].finish_reason == "tool_calls" and msg.tool_calls
            calls: dict[int, list[str]] = {}
            for d in (tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or [] if ch.choices):
                calls.setdefault(d.index, [d.function.name, ""])[1] += d.function.arguments or ""
            assert [tuple(c) for c in calls.values()] == [(c.function.name, c.function.arguments)
                                                          for c in msg.tool_calls]
            for c in msg.tool_calls:
                jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])
            content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            assert content == (msg.content or "")
            if "extra_body" in kw:  # the forced free-format reply: two calls, text before them is content
                assert len(msg.tool_calls) == 2 and json.loads(msg.tool_calls[1].function.arguments) == {"city": "Oslo"}
                assert msg.content == ("Sure." if fmt == "hermes" else None)

    asyncio.run(run())


def test_forced_calls_when_the_first_backend_has_no_structural_tags(tiny_models):
    """outlines-core compiles no structural tags; the grammar router sends them to a backend that does,
    so forced calls keep the format's syntax and a reasoning reply's answer is still held."""
    from radixgen.runtime.engine import Engine

    eng = Engine(model=str(tiny_models["llama"]), grammar_backend="outlines", context_length=1024,
                 max_total_tokens=4096)
    try:
        client = asgi_client(create_app(eng, model_name="tiny"))
        kw = dict(model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER], temperature=0,
                  max_tokens=60, tool_choice={"type": "function", "function": {"name": "get_weather"}})

        async def run() -> None:
            full = await client.chat.completions.create(**kw)
            (call,) = full.choices[0].message.tool_calls
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
            assert full.choices[0].finish_reason == "tool_calls"

        async def reasoning() -> None:  # a reasoning reply's answer is held by a structural tag
            thinking = asgi_client(create_app(eng, model_name="tiny", reasoning_parser="deepseek_r1"))
            out = await thinking.chat.completions.create(model="tiny", messages=ASK, max_tokens=8,
                                                         response_format={"type": "json_object"})
            assert out.choices[0].message.reasoning_content is not None

        asyncio.run(run())
        asyncio.run(reasoning())
    finally:
        eng.shutdown()
