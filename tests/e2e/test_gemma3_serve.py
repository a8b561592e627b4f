"""`radixgen serve` on the public Gemma 3 270M Q4_K_M GGUF, driven by the official openai client: the
file carries no chat template, so the server renders Gemma's turns (system folded into the first
user turn); a JSON-schema response_format comes back valid and ends (the file is the pretrained
model, which does not answer chat turns on its own: its free text is not checked)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.e2e.scaleout_helpers import start

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "country"],
          "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}}}


@pytest.fixture(scope="module")
def gemma_server(gemma3_path, tmp_path_factory):
    svc = start(["serve", "--model", str(gemma3_path), "--max-total-tokens", "4096"],
                tmp_path_factory.mktemp("gemma3") / "serve.log")
    yield svc
    svc.stop()


def test_gemma3_chat_and_json_schema(gemma_server, gemma3_path):
    from radixgen.runtime.tokenizer import load_tokenizer

    client = openai.OpenAI(base_url=gemma_server.url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "What is the capital of France?"}]
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    # the prompt: <bos> + one user turn holding the system text + the model turn's opening
    tok = load_tokenizer(gemma3_path)
    expected = tok.encode("<start_of_turn>user\nAnswer briefly.\n\nWhat is the capital of France?<end_of_turn>\n"
                          "<start_of_turn>model\n")
    assert plain.usage.prompt_tokens == len(expected) and plain.usage.completion_tokens == 8
    structured = client.chat.completions.create(
        model=model, messages=messages, max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}})
    assert structured.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(structured.choices[0].message.content), SCHEMA)

