"""Engine end to end on SmolLM2: HF greedy parity, batching, streaming, logprobs, bad input."""

from __future__ import annotations

import gc
import inspect
import threading
import weakref

import pytest
import torch

from radixgen.runtime.engine import Engine

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]
GREEDY = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """Greedy decoding with HF's own forward and KV cache (no eos handling: like ignore_eos). The cache's
    argument and output field are `cache` from transformers 5.25 on (`past_key_values` is deprecated there)."""
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out, past, x = [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            res = model(x, use_cache=True, **{key: past})
            past, nxt = getattr(res, key), int(res.logits[0, -1].argmax())
            out.append(nxt)
            x = torch.tensor([[nxt]])
    return out


def test_greedy_matches_hf(engine, hf_smollm2):
    for prompt in PROMPTS:
        ours = engine.generate(prompt, GREEDY)
        ids = engine.tokenizer.encode(prompt)
        assert ours["output_ids"] == hf_greedy(hf_smollm2, ids, 64), prompt
        assert ours["text"] == engine.tokenizer.decode(ours["output_ids"])


def test_batch_equals_alone(engine):
    prompts = [f"Question {i}: what is {i} times {i + 3}? Answer:" + " think" * (i * 3) for i in range(8)]
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    engine.flush_cache()
    alone = [engine.generate(p, params)["output_ids"] for p in prompts]
    engine.flush_cache()
    together = [r["output_ids"] for r in engine.generate(prompts, params)]
    assert together == alone


def test_meta_info_and_stop(engine):
    r = engine.generate("Count: 1, 2, 3,", {"temperature": 0, "max_new_tokens": 40, "stop": [" 6"]})
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": " 6"}
    assert r["text"] == " 4, 5,"
    assert r["meta_info"]["prompt_tokens"] == len(engine.tokenizer.encode("Count: 1, 2, 3,"))
    assert r["meta_info"]["completion_tokens"] == len(r["output_ids"])
    r = engine.generate("Count: 1, 2, 3,", {"temperature": 0, "max_new_tokens": 5})
    assert r["meta_info"]["finish_reason"]["type"] == "length" and len(r["output_ids"]) == 5


def test_eos_stops(engine):
    chat = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    r = engine.generate(chat, {"temperature": 0, "max_new_tokens": 200})
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    assert "<|im_end|>" not in r["text"]


def test_stream_equals_full(engine):
    params = {"temperature": 0, "max_new_tokens": 30, "stop": "\n\n"}
    full = engine.generate("Write a haiku about the sea:\n", params)
    chunks = list(engine.generate("Write a haiku about the sea:\n", params, stream=True))
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert [t for c in chunks for t in c["output_ids"]] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]


def test_prompt_logprobs_match_hf(engine, hf_smollm2):
    prompt = "The quick brown fox jumps over the lazy dog"
    ids = engine.tokenizer.encode(prompt)
    r = engine.generate(prompt, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    got = r["meta_info"]["input_token_logprobs"]
    assert got[0] == (None, ids[0]) and [t for _, t in got] == ids
    with torch.no_grad():
        ref = torch.log_softmax(hf_smollm2(torch.tensor([ids])).logits[0].float(), -1)
    want = [ref[i - 1, ids[i]].item() for i in range(1, len(ids))]
    assert max(abs(a - b) for (a, _), b in zip(got[1:], want, strict=True)) < 2e-3
    # from a later start, after the prefix was cached by the call above
    r2 = engine.generate(prompt, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=5)
    assert [t for _, t in r2["meta_info"]["input_token_logprobs"]] == ids[5:]
    assert max(abs(a - b) for (a, _), b in zip(r2["meta_info"]["input_token_logprobs"], want[4:], strict=True)) < 2e-3


def test_output_logprobs(engine, hf_smollm2):
    prompt = "The capital of France is"
    r = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 4}, return_logprob=True, top_logprobs_num=3)
    ids = engine.tokenizer.encode(prompt) + r["output_ids"]
    with torch.no_grad():
        ref = torch.log_softmax(hf_smollm2(torch.tensor([ids])).logits[0].float(), -1)
    n = len(ids) - 4
    for k, (lp, tok) in enumerate(r["meta_info"]["output_token_logprobs"]):
        assert abs(lp - ref[n - 1 + k, tok].item()) < 2e-3
        top = r["meta_info"]["output_top_logprobs"][k]
        assert len(top) == 3 and top[0][1] == tok  # greedy picks the top-1


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(prompt=""), "prompt"),
        (dict(prompt="hi", sampling_params={"max_new_tokens": -1}), "max_new_tokens"),
        (dict(prompt="hi", sampling_params={"temperature": -0.5}), "temperature"),
        (dict(prompt="hi", sampling_params={"top_p": 0}), "top_p"),
        (dict(prompt="hi", sampling_params={"bogus": 1}), "bogus"),
        (dict(input_ids=[1, 10**9]), "input_ids"),
    ],
)
def test_bad_input_names_the_field(engine, kwargs, field):
    with pytest.raises(ValueError, match=field):
        engine.generate(**kwargs)


def test_prompt_longer_than_context(engine):
    too_long = list(range(10, 10 + engine.context_length + 5))
    with pytest.raises(ValueError, match="context length"):
        engine.generate(input_ids=too_long)
    # the engine keeps serving
    assert engine.generate("Hello", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


async def _agen(engine):
    one = await engine.async_generate("The capital of France is", {"temperature": 0, "max_new_tokens": 8})
    stream = await engine.async_generate("The capital of France is", {"temperature": 0, "max_new_tokens": 8},
                                         stream=True)
    text = "".join([c["text"] async for c in stream])
    return one, text


def test_async_generate(engine):
    import asyncio

    one, text = asyncio.run(_agen(engine))
    assert one["text"] == text and one["meta_info"]["completion_tokens"] == 8


def test_shut_down_engine_frees_its_memory(tiny_models):
    """Once shut down and dropped, an engine's reference cycles are collected: the KV pool and the
    scheduler are freed (the engine freezes nothing out of the collector; see
    test_engine_process_state.py)."""
    eng = Engine(str(tiny_models["llama"]), max_total_tokens=256)
    eng.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 2})
    kv_buffer, scheduler = weakref.ref(eng.runner.token_to_kv_pool.k_buffer[0]), weakref.ref(eng.scheduler)
    eng.shutdown()
    del eng
    gc.collect()
    assert kv_buffer() is None and scheduler() is None


@pytest.mark.parametrize("delay", [0.15, 0.4])
def test_requests_racing_shutdown_are_answered(tiny_models, delay):
    """Threads generating while another calls `shutdown()`: every call returns (finished, or aborted
    by the shutdown) or raises the engine's shut-down error; none waits forever. A request that passed
    the shut-down check and was queued after the scheduler's last look at its inbox used to be left
    unanswered (a streaming program's next `gen` racing a script's final `shutdown()`)."""
    eng = Engine(str(tiny_models["llama"]), num_threads=1)
    outcomes: list[str] = []

    def client() -> None:
        while True:
            try:
                out = eng.generate(input_ids=[5, 6, 7, 8],
                                   sampling_params={"max_new_tokens": 2, "temperature": 0, "ignore_eos": True})
            except RuntimeError as e:
                outcomes.append(str(e))
                return
            outcomes.append(out["meta_info"]["finish_reason"]["type"])

    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    threading.Event().wait(delay)
    eng.shutdown()
    for t in threads:
        t.join(timeout=20)
    assert not [t for t in threads if t.is_alive()], "a generate call never returned after shutdown()"
    assert set(outcomes) <= {"length", "abort", "this Engine has been shut down"}, set(outcomes)
    assert outcomes.count("this Engine has been shut down") == len(threads)
