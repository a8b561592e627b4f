"""The official `openai` client against `radixgen serve`: response_format json_schema, tools, streaming.

Run: python examples/openai_client.py            (starts a server on 127.0.0.1 itself)
     python examples/openai_client.py http://127.0.0.1:30000   (uses a running `radixgen serve`)
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import openai


def start_server() -> tuple[subprocess.Popen, str]:
    """`radixgen serve` on a free loopback port; returns the process and its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "radixgen.runtime.cli", "serve", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("radixgen serve did not come up")


def demo(base_url: str, max_tokens: int | None = None) -> dict:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused")
    budget = max_tokens or 96
    results = {}

    # 1. Structured output: the reply is guaranteed to parse and match the schema.
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population_millions": {"type": "number"}},
              "required": ["city", "population_millions"]}
    reply = client.chat.completions.create(
        model="default", temperature=0, max_tokens=max(budget, 48),
        messages=[{"role": "user", "content": "Describe Tokyo as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    results["json"] = json.loads(reply.choices[0].message.content)
    print("json_schema ->", results["json"], "| cached prompt tokens:",
          reply.usage.prompt_tokens_details.cached_tokens)

    # 2. Tools: tool_choice="required" makes the model call one, with arguments that fit its schema.
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"]}}}
    reply = client.chat.completions.create(
        model="default", temperature=0, max_tokens=max(budget, 48), tools=[weather], tool_choice="required",
        messages=[{"role": "user", "content": "What is the weather like in Paris?"}])
    call = reply.choices[0].message.tool_calls[0]
    results["tool_call"] = (call.function.name, json.loads(call.function.arguments))
    print("tool call ->", *results["tool_call"])

    # 3. Streaming: text arrives in chunks as it is generated.
    print("stream -> ", end="", flush=True)
    pieces = []
    for chunk in client.chat.completions.create(
            model="default", temperature=0, max_tokens=budget, stream=True,
            messages=[{"role": "user", "content": "Write one sentence about the sea."}]):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            print(pieces[-1], end="", flush=True)
    print()
    results["stream"] = "".join(pieces)
    return results


def main(base_url: str | None = None, max_tokens: int | None = None) -> dict:
    if base_url is not None:
        return demo(base_url, max_tokens)
    proc, url = start_server()
    try:
        return demo(url, max_tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
