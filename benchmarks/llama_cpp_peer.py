"""llama.cpp (llama-cpp-python) on the same GGUF, as a peer column for bench_decode.py.

A benchmark-only dependency (`pip install llama-cpp-python`, built from source); `available()` is
False without it and the benchmark skips the column. llama-cpp-python 0.3.36 segfaults on some CPUs
while repacking weights into its extra buffer types, so the model loads with `use_extra_bufts` off
(the plain CPU buffers; its AVX-512 / VNNI dot products still run).
"""

from __future__ import annotations

import importlib.util
import time


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def _load(path: str, threads: int, n_ctx: int):
    import llama_cpp
    import llama_cpp.llama_cpp as raw

    default_params = raw.llama_model_default_params

    def without_extra_bufts():
        params = default_params()
        params.use_extra_bufts = False
        return params

    raw.llama_model_default_params = without_extra_bufts  # the Llama constructor reads its params from here
    try:
        return llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_batch=512,
                               verbose=False)
    finally:
        raw.llama_model_default_params = default_params


def bench(path: str, threads: int, prefill_ids: list[int], decode_prompt: list[int], new_tokens: int) -> dict:
    """Prefill tokens/s of `prefill_ids` and greedy batch-1 decode tokens/s of `new_tokens` after
    `decode_prompt` (llama.cpp's own sampler, as ours samples too)."""
    llm = _load(path, threads, n_ctx=max(len(prefill_ids), len(decode_prompt) + new_tokens) + 16)
    try:
        llm.reset()
        llm.eval(prefill_ids)  # warm-up
        llm.reset()
        t = time.perf_counter()
        llm.eval(prefill_ids)
        prefill = len(prefill_ids) / (time.perf_counter() - t)
        llm.reset()
        t = time.perf_counter()
        for n, _ in enumerate(llm.generate(decode_prompt, temp=0.0, reset=True), start=1):
            if n == new_tokens:
                break
        decode1 = new_tokens / (time.perf_counter() - t)
    finally:
        llm.close()
    return {"prefill_tok_s": prefill, "decode_b1_tok_s": decode1}
