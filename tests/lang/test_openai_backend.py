"""The OpenAI backend's request shapes and its fallbacks for remotes that lack features (e.g. no prompt
logprobs), against a canned third-party OpenAI-compatible server (an httpx MockTransport). The same
backend runs against our real server in tests/e2e/test_openai_lang_backend.py."""

from __future__ import annotations

import json

import pytest

import radixgen as sgl

pytest.importorskip("openai")
try:  # the openai client's own HTTP library (httpx2 in recent releases, httpx before)
    import httpx2 as httpx
except ImportError:
    httpx = pytest.importorskip("httpx")


class FakeServer:
    def __init__(self, prompt_logprobs: bool = True) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.prompt_logprobs = prompt_logprobs

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        path = request.url.path
        self.requests.append((path, body))
        usage = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8,
                 "prompt_tokens_details": {"cached_tokens": 3}}
        if path.endswith("/chat/completions"):
            rf = body.get("response_format")
            content = json.dumps({"choice": "yes"}) if rf and rf["json_schema"]["name"] == "select" else "Paris"
            return httpx.Response(200, json={
                "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"], "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}]})
        if body.get("echo"):
            if not self.prompt_logprobs:
                return httpx.Response(400, json={"error": {"message": "echo not supported"}})
            choices = []
            for i, prompt in enumerate(body["prompt"]):
                # tokens: "Answer:" " " + choice (merged with the space), prompt logprob -0.5 each,
                # the choice's token -1 for "no", -0.2 for "yes"
                head, choice = prompt[:7], prompt[7:]
                lp = -0.2 if choice.strip() == "yes" else -1.0
                choices.append({"index": i, "text": prompt, "finish_reason": "length", "logprobs": {
                    "tokens": [head, choice], "text_offset": [0, 7], "token_logprobs": [None, lp],
                    "top_logprobs": None}})
            return httpx.Response(200, json={"id": "p", "object": "text_completion", "created": 0,
                                             "model": body["model"], "choices": choices, "usage": usage})
        return httpx.Response(200, json={
            "id": "t1", "object": "text_completion", "created": 0, "model": body["model"], "usage": usage,
            "choices": [{"index": 0, "text": " 42", "finish_reason": "stop", "logprobs": None}]})


def make(server: FakeServer, **kw):
    client = httpx.Client(transport=httpx.MockTransport(server))
    return sgl.OpenAI("test-model", base_url="http://fake/v1", api_key="k", http_client=client, **kw)


def test_chat_model_gen_and_select():
    server = FakeServer()
    be = make(server)

    @sgl.function
    def chat(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Capital of France?")
        s += sgl.assistant(sgl.gen("a", max_tokens=5, top_k=3))
        s += sgl.user("Sure?")
        s += sgl.assistant(sgl.select("sure", ["yes", "no"]))

    st = chat.run(backend=be, temperature=0)
    assert st.error() is None, st.error()
    assert st["a"] == "Paris" and st["sure"] == "yes"
    path, body = server.requests[0]
    assert path.endswith("/chat/completions")
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Capital of France?"}]
    assert body["max_tokens"] == 5 and body["top_k"] == 3 and "<|im_end|>" not in body.get("stop", [])
    assert server.requests[1][1]["response_format"]["json_schema"]["schema"]["properties"]["choice"]["enum"] \
        == ["yes", "no"]
    assert st.get_meta_info("a")["cached_tokens"] == 3

    @sgl.function
    def partial(s):
        s += sgl.user("Hi")
        s += sgl.assistant("Sure, " + sgl.gen("a"))

    err = partial.run(backend=be).error()
    assert isinstance(err, ValueError) and "assistant turn" in str(err)


def test_completion_model_gen_and_scored_select():
    server = FakeServer()
    be = make(server, is_chat_model=False)

    @sgl.function
    def prog(s):
        s += "Answer: "
        s += sgl.select("yn", ["no", "yes"])
        s += "\nNumber:" + sgl.gen("n", max_tokens=3, regex="[0-9 ]+")

    st = prog.run(backend=be)
    assert st.error() is None, st.error()
    assert st["yn"] == "yes" and st["n"] == " 42"
    meta = st.get_meta_info("yn")
    assert meta["token_logprobs"] == [[-1.0], [-0.2]]
    path, body = server.requests[-1]
    assert path.endswith("/completions") and body["prompt"] == "Answer: yes\nNumber:" and body["regex"] == "[0-9 ]+"


def test_select_falls_back_to_constraints_without_prompt_logprobs():
    server = FakeServer(prompt_logprobs=False)
    be = make(server, is_chat_model=False)

    @sgl.function
    def prog(s):
        s += "Answer: "
        s += sgl.select("x", ["42", "7"])

    st = prog.run(backend=be)
    # the canned server ignores the regex and answers " 42": the select must not silently accept it
    assert isinstance(st.error(), RuntimeError) and "did not constrain" in str(st.error())
    assert server.requests[-1][1]["regex"] == "(42|7)"
