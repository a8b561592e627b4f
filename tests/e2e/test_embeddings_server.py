"""/v1/embeddings and /encode on the real `radixgen serve` (SmolLM2), read by the official `openai`
client. Correctness against HF transformers is tests/runtime/test_embeddings.py's; here: the
protocol (the four input shapes, base64 as the client decodes it against float, pooling, the native
route) and the 400s."""

from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.conftest import MODEL

openai = pytest.importorskip("openai")


def test_embeddings_through_the_openai_client(server, client):
    texts = ["The capital of France is Paris.", "Bonjour"]
    client.embeddings.create(model=MODEL, input=texts)  # both prompts cached: the calls below compute alike
    as_b64 = client.embeddings.create(model=MODEL, input=texts)  # the client asks for base64 and decodes it
    as_float = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in as_float.data] == [0, 1] and as_float.model == MODEL
    for a, b in zip(as_b64.data, as_float.data, strict=True):
        assert len(b.embedding) == 576 and abs(np.linalg.norm(b.embedding) - 1) < 1e-5
        assert np.array_equal(np.asarray(a.embedding, dtype=np.float32), np.asarray(b.embedding, dtype=np.float32))
    status, tok = server.post("/tokenize", {"text": texts[0]})
    assert status == 200
    ids = tok["tokens"]
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens >= len(ids) + 1
    by_ids = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    by_lists = client.embeddings.create(model=MODEL, input=[ids, ids[:3]], encoding_format="float",
                                        dimensions=576)
    assert np.allclose(by_ids.data[0].embedding, by_lists.data[0].embedding, atol=1e-5)
    mean = client.embeddings.create(model=MODEL, input=ids, encoding_format="float", extra_body={"pooling": "mean"})
    assert not np.allclose(mean.data[0].embedding, by_ids.data[0].embedding, atol=1e-3)
    status, native = server.post("/encode", {"input_ids": ids, "pooling": "mean"})
    assert status == 200 and native["meta_info"]["prompt_tokens"] == len(ids)
    assert np.allclose(native["embedding"], mean.data[0].embedding, atol=1e-5)
    status, natives = server.post("/encode", {"text": texts})
    assert status == 200 and len(natives) == 2
    assert np.allclose(natives[1]["embedding"], as_float.data[1].embedding, atol=1e-5)


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["ok", ""]}, "input"),
    ({"input": [[1, 2], []]}, "input"),
    ({"input": [10**9]}, "input"),
    ({"input": "x", "dimensions": 64}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "pooling": "cls"}, "pooling"),
])
def test_bad_embedding_requests_are_400s(server, body, param):
    status, out = server.post("/v1/embeddings", {"model": MODEL, **body})
    assert status == 400, out
    assert out["error"]["param"] == param, out


def test_unknown_fields_are_ignored_with_a_warning(server, client):
    out = client.embeddings.create(model=MODEL, input="hi", encoding_format="float",
                                   extra_body={"some_future_field": 1})
    assert len(out.data) == 1
    assert "'some_future_field' are not supported and were ignored" in server.log.read_text()
