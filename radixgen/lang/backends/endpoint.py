"""RuntimeEndpoint: the program language's backend over HTTP to a `radixgen serve` (native /generate).

It is the in-process `EngineBackend` (backends/engine.py) driving a thin remote stand-in for the
Engine, so gen / select / token healing / fork make the same engine calls, and a greedy program gives
the same result as in process:

- gen: POST /generate (`"stream": true` for streaming: SSE chunks whose `text` and `output_ids` are
  cumulative, as SGLang's server sends them; turned back into deltas here).
- select: the shared prefix is prefilled (`max_new_tokens=0`), then ONE batched /generate with every
  prompt + choice and `return_logprob` scores all choices; the texts are tokenized in one
  POST /tokenize call first (the ids must be the server's own).
- cache_prefix (fork, run_batch): a `max_new_tokens=0` /generate; flush_cache: POST /flush_cache;
  get_server_info: GET /get_server_info; get_model_name: the `model_path` of /get_model_info.
- roles: GET /get_model_info returns the chat template text and special tokens; the template is
  rendered here with jinja2 the way HF's `apply_chat_template` does.

Only the standard library is used for HTTP (urllib), one request per call, so it is thread-safe.
Errors: a 400 from the server is raised as ValueError (as the Engine raises), others as RuntimeError.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from radixgen.lang.backends.engine import EngineBackend
from radixgen.lang.choices import ChoicesDecision


class _HTTP:
    def __init__(self, base_url: str, api_key: str | None, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def _open(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=self.headers)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raw = e.read().decode("utf-8", "replace")
            try:
                msg = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = raw or str(e)
            if e.code == 400:
                raise ValueError(msg) from None
            raise RuntimeError(f"{method} {self.base_url}{path} failed with HTTP {e.code}: {msg}") from None
        except urllib.error.URLError as e:
            raise RuntimeError(f"cannot reach the radixgen server at {self.base_url}: {e.reason}") from None

    def get(self, path: str) -> Any:
        with self._open("GET", path) as r:
            return json.loads(r.read())

    def post(self, path: str, body: Any) -> Any:
        with self._open("POST", path, body) as r:
            return json.loads(r.read())

    def stream(self, path: str, body: Any) -> Iterator[dict]:
        """SSE `data:` events as JSON objects until `data: [DONE]`."""
        with self._open("POST", path, body) as r:
            for raw in r:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(f"the server failed mid-stream: {event['error'].get('message')}")
                yield event


class _HFInfo:
    """The attributes of an HF tokenizer that EngineBackend reads (`all_special_ids`, `bos_token_id`)."""

    def __init__(self, info: dict) -> None:
        self.all_special_ids = list(info.get("all_special_ids") or [])
        self.bos_token_id = info.get("bos_token_id")
        self.special_tokens_map = dict(info.get("special_tokens_map") or {})


class RemoteTokenizer:
    """encode / decode through the server (/tokenize, /detokenize, cached); the chat template locally."""

    def __init__(self, http: _HTTP, info: dict, cache_size: int = 4096) -> None:
        self.http = http
        self.hf = _HFInfo(info)
        self.eos_token_ids = list(info.get("eos_token_ids") or [])
        self.chat_template: str | None = info.get("chat_template")
        self.vocab_size = info.get("vocab_size")
        self._cache: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._compiled: Any = None

    def _remember(self, key: tuple[str, bool], ids: list[int]) -> None:
        with self._lock:
            self._cache[key] = ids
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def prefetch(self, texts: Sequence[str], add_special_tokens: bool = True) -> None:
        """Tokenize several texts in one call (select tokenizes prompt + every choice)."""
        todo = sorted({t for t in texts if (t, add_special_tokens) not in self._cache})
        if todo:
            ids = self.http.post("/tokenize", {"text": todo, "add_special_tokens": add_special_tokens})["tokens"]
            for t, i in zip(todo, ids, strict=True):
                self._remember((t, add_special_tokens), list(i))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        key = (text, add_special_tokens)
        with self._lock:
            hit = self._cache.get(key)
        if hit is None:
            hit = list(self.http.post("/tokenize", {"text": text, "add_special_tokens": add_special_tokens})["tokens"])
            self._remember(key, hit)
        return list(hit)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.http.post("/detokenize", {"tokens": list(ids), "skip_special_tokens": skip_special_tokens})["text"]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        if not self.chat_template:
            raise ValueError("the served model has no chat template; send a plain prompt instead")
        if self._compiled is None:
            self._compiled = _compile_template(self.chat_template)
        return self._compiled.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                     **self.hf.special_tokens_map)


def _compile_template(source: str) -> Any:
    """A jinja2 template set up as transformers' chat-template renderer sets it up."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        from datetime import datetime

        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


class _RemoteEngine:
    """What EngineBackend calls on an Engine, over HTTP."""

    def __init__(self, http: _HTTP) -> None:
        self.http = http
        self.info = http.get("/get_model_info")
        self.tokenizer = RemoteTokenizer(http, self.info)

    def generate(self, prompt: Any = None, sampling_params: Any = None, input_ids: Any = None,
                 return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
                 stream: bool = False, extra_key: str | None = None, rid: str | None = None) -> Any:
        body = {"text": prompt, "input_ids": input_ids, "sampling_params": sampling_params,
                "return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
                "top_logprobs_num": top_logprobs_num, "stream": stream, "extra_key": extra_key, "rid": rid}
        body = {k: v for k, v in body.items() if v is not None}
        if stream:
            return _deltas(self.http.stream("/generate", body))
        return self.http.post("/generate", body)

    def flush_cache(self) -> bool:
        """True once flushed; False while requests are in flight (the server answers 400 then)."""
        try:
            return bool(self.http.post("/flush_cache", {}).get("success"))
        except ValueError:
            return False

    def shutdown(self) -> None:  # the server outlives its clients
        return None


def _deltas(events: Iterator[dict]) -> Iterator[dict]:
    """The server's cumulative stream chunks as the in-process engine's delta chunks."""
    text_pos = ids_pos = 0
    try:
        for event in events:
            text, ids = event.get("text") or "", event.get("output_ids") or []
            yield {"text": text[text_pos:], "output_ids": ids[ids_pos:], "meta_info": event["meta_info"]}
            text_pos, ids_pos = len(text), len(ids)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()  # closes the HTTP response: the server aborts the request


class RuntimeEndpoint(EngineBackend):
    """Backend for a running `radixgen serve` at `base_url` (e.g. "http://127.0.0.1:30000")."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0,
                 token_healing: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = _HTTP(self.base_url, api_key, timeout)
        super().__init__(_RemoteEngine(self.http), token_healing=token_healing)

    @property
    def model_info(self) -> dict:
        return self.engine.info

    def select(self, ctx: Any, choices: Sequence[str], temperature: float, choices_method: Any) -> ChoicesDecision:
        # one /tokenize call for the prompt and every prompt + choice (or every choice alone)
        self.tokenizer.prefetch([ctx.text, *(ctx.text + c for c in choices)] if ctx.text else list(choices))
        return super().select(ctx, choices, temperature, choices_method)

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def get_model_name(self) -> str:
        return str(self.model_info.get("model_path") or self.model_info.get("model_name"))

    def get_server_info(self) -> dict:
        return self.http.get("/get_server_info")

    def shutdown(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.base_url!r})"
