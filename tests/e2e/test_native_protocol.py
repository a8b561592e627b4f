"""SGLang's native routes (server/native.py) on the session server: the fields SGLang's client sends,
SGLang's shapes, and clear 400s for what cannot be honoured (the server keeps serving, no KV leaks)."""

from __future__ import annotations

import http.client
import json
import time

import pytest

pytestmark = pytest.mark.slow

PROMPT = "Count with words and then digits: one, two, three, 4"


def _stream(server, body: dict) -> list[dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    events = [ln[6:] for ln in conn.getresponse().read().decode().splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _kv_after_flush(server, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, out = server.post("/flush_cache", {})
        if status == 200 and out["success"]:
            return json.loads(server.get("/stats")[1])["kv_used"]
        assert status == 400 and out["error"]["code"] == "cache_busy"
        time.sleep(0.2)
    raise AssertionError("flush_cache kept answering busy")


def test_generate_takes_what_sglangs_client_sends(server):
    sp = {"max_new_tokens": 8, "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [],
          "temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
          "presence_penalty": 0.0, "ignore_eos": False, "regex": None, "json_schema": None,
          "skip_special_tokens": True, "spaces_between_special_tokens": True}
    status, out = server.post("/generate", {"text": "The capital of France is", "sampling_params": sp,
                                            "return_logprob": True, "logprob_start_len": 2, "top_logprobs_num": 1,
                                            "return_text_in_logprobs": True})
    assert status == 200, out
    meta = out["meta_info"]
    assert len(meta["output_token_logprobs"]) == len(out["output_ids"]) == meta["completion_tokens"]
    assert "".join(e[2] for e in meta["output_token_logprobs"]) == out["text"]
    assert [e[1] for e in meta["input_token_logprobs"]][-1] == \
        server.post("/tokenize", {"text": "The capital of France is"})[1]["tokens"][-1]
    status, plain = server.post("/generate", {"text": "The capital of France is", "sampling_params": sp,
                                              "return_logprob": True})
    assert plain["text"] == out["text"] and all(e[2] is None for e in plain["meta_info"]["output_token_logprobs"])


def test_stop_regex_and_no_stop_trim(server):
    sp = {"max_new_tokens": 24, "temperature": 0}
    full = server.post("/generate", {"text": PROMPT, "sampling_params": sp})[1]["text"]
    status, out = server.post("/generate", {"text": PROMPT, "sampling_params": {**sp, "stop_regex": r"[0-9]"}})
    assert status == 200
    cut = full.index(next(c for c in full if c.isdigit())) + 1
    assert out["text"] == full[:cut] and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "[0-9]"}
    chunks = _stream(server, {"text": PROMPT, "sampling_params": {**sp, "stop_regex": [r"[0-9]"]}})
    assert chunks[-1]["text"] == out["text"] and all(out["text"].startswith(c["text"]) for c in chunks)
    assert _kv_after_flush(server) == 0  # the request cut by the regex was aborted and its KV freed
    stop = full[cut - 1]
    status, kept = server.post("/generate", {"text": PROMPT, "sampling_params": {**sp, "stop": [stop],
                                                                                  "no_stop_trim": True}})
    assert kept["text"] == full[:cut]


@pytest.mark.parametrize("body, param", [
    ({"text": "a", "image_data": "aGk="}, "image_data"),
    ({"text": "a", "sampling_params": {"stop_regex": "(open"}}, "sampling_params.stop_regex"),
    ({"text": "a", "sampling_params": {"stop_regex": "x", "n": 2}}, "sampling_params.stop_regex"),
    ({"text": ["a", "b"], "sampling_params": {"stop_regex": "x"}}, "sampling_params.stop_regex"),
    ({"text": "a", "sampling_params": {"beam_width": 2}}, "sampling_params.beam_width"),
    ({"text": "a", "lora_path": "x"}, "lora_path"),
])
def test_what_cannot_be_honoured_is_a_400(server, body, param):
    status, out = server.post("/generate", body)
    assert status == 400 and out["error"]["param"] == param, out
    assert server.post("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 1}})[0] == 200


def test_info_routes(server):
    for route in ("/get_model_info", "/model_info"):
        status, info = server.get(route)
        info = json.loads(info)
        assert status == 200 and info["model_path"].endswith(".gguf") and info["is_generation"] is True
    for route in ("/get_server_info", "/server_info"):
        status, info = server.get(route)
        info = json.loads(info)
        assert status == 200 and info["max_total_num_tokens"] == info["max_total_tokens"] > 0
        assert info["internal_states"][0]["requests_finished"] >= 0
    status, out = server.post("/concate_and_append_request", {"src_rids": ["a", "b"], "dst_rid": "c"})
    assert status == 200 and out["success"] is True
    assert server.post("/concate_and_append_request", {"src_rids": "a"})[0] == 400
    assert server.get("/health_generate")[0] == 200
    assert server.get("/flush_cache")[0] in (200, 400)
    assert server.post("/abort_request", {"rid": "no-such-request"})[0] == 200
    assert server.post("/abort_request", {})[0] == 400
