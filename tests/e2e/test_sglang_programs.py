"""SGLang-style programs, written the SGLang way (only the import differs), on both backends: the
in-process Engine and RuntimeEndpoint to `radixgen serve` (both the real SmolLM2, greedy).

Oracles: the engine's own `generate` on the text a program built (a program's gen must equal it, on
both backends, so they also agree with each other), HF's chat template for roles, the dtype regexes.
"""

from __future__ import annotations

import asyncio
import re

import pytest

import radixgen as sgl
from radixgen.lang.backends.default import as_backend

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FEW_SHOT = ("Q: What is the capital of Italy?\nA: Rome\n"
            "Q: What is the capital of Spain?\nA: Madrid\n"
            "Q: What is the capital of Germany?\nA: Berlin\n")


@sgl.function
def few_shot(s, question):
    s += FEW_SHOT + "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=8, stop="\n")


@sgl.function
def typed(s):
    s += "The number of days in a week is " + sgl.gen("days", regex=sgl.REGEX_INT, max_tokens=4)
    s += ". Pi is about " + sgl.gen("pi", dtype=float, max_tokens=8)
    s += ". Is the sky blue? " + sgl.gen("blue", regex=sgl.REGEX_BOOL)
    s += " Name a city: " + sgl.gen_string("city", max_tokens=12)


@sgl.function
def capital(s):
    s += "The capital city of France is"
    s += sgl.select("city", choices=[" Paris", " London", " Berlin", " Madrid"])


@sgl.function
def chat(s, question):
    s += sgl.system("You are a terse assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=16))


@sgl.function
def story(s):
    s += "Once upon a time, in a small village by the sea,"
    s += sgl.gen("story", max_tokens=12)


@sgl.function
def until_digit(s):
    s += "Count with words and then digits: one, two, three, 4"
    s += sgl.gen("tail", max_tokens=24, stop_regex=r"[0-9]")


@sgl.function
def parallel_facts(s):
    s += "Facts to remember.\n"
    facts = ["Ethan is the father of Liam.", "Noah is the father of Julian.", "Oliver is the father of Carlos."]
    forks = s.fork(len(facts))
    forks += lambda i: f"Fact {i}: " + facts[i] + "\n"
    forks.join(mode="concate_and_append")
    s += "Question: Who is the father of Julian?\nAnswer:" + sgl.gen("answer", max_tokens=6, stop="\n")


@pytest.fixture(scope="module", params=["engine", "endpoint"])
def backend(request, engine, server):
    if request.param == "engine":
        return as_backend(engine)
    return sgl.RuntimeEndpoint(server.url)


def _direct(engine, text: str, **sampling) -> str:
    return engine.generate(text, {"temperature": 0, **sampling})["text"]


def test_gen_with_stop(backend, engine):
    st = few_shot.run(question="What is the capital of France?", temperature=0, backend=backend)
    prompt = FEW_SHOT + "Q: What is the capital of France?\nA:"
    assert st["answer"] == _direct(engine, prompt, max_new_tokens=8, stop="\n") == " Paris"
    assert st.text() == prompt + st["answer"]


def test_regex_constants_and_dtypes(backend):
    st = typed.run(temperature=0, backend=backend)
    assert st.error() is None
    assert re.fullmatch(sgl.REGEX_INT, st["days"]) and st["days"].startswith("7")
    assert re.fullmatch(sgl.REGEX_FLOAT, st["pi"]) and st["pi"].startswith("3.14")
    assert st["blue"] in ("True", "False")
    assert re.fullmatch(sgl.REGEX_STR, st["city"])


def test_select(backend):
    st = capital.run(backend=backend)
    assert st["city"] == " Paris" and st.text() == "The capital city of France is Paris"
    assert len(st.get_meta_info("city")["scores"]) == 4


def test_roles_render_with_the_models_chat_template(backend, engine):
    st = chat.run(question="Name one colour.", temperature=0, backend=backend)
    msgs = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name one colour."}, {"role": "assistant", "content": st["answer"]}]
    assert st.text() == engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=False)
    assert st.messages() == msgs
    prompt = engine.tokenizer.apply_chat_template(msgs[:2], add_generation_prompt=True)
    assert st["answer"] == _direct(engine, prompt, max_new_tokens=16, stop=["<|im_end|>"])


def test_streaming_with_meta_data(backend):
    done = story.run(temperature=0, backend=backend)
    final, meta = done["story"], done.get_meta_info("story")

    async def collect():
        st = story.run(temperature=0, backend=backend, stream=True)
        return [item async for item in st.text_async_iter("story", return_meta_data=True)]

    items = asyncio.run(collect())
    assert "".join(chunk for chunk, _ in items) == final and len(items) > 3
    counts = [meta.get("completion_tokens", 0) for _, meta in items]
    assert counts == sorted(counts) and counts[-1] == meta["completion_tokens"] >= 12  # (+1 healed token)
    assert items[-1][1]["finish_reason"]["type"] == "length"
    assert all(meta["finish_reason"] is None for _, meta in items[:-1] if meta)
    with pytest.raises(ValueError, match="needs a variable name"):
        next(done.text_iter(return_meta_data=True))


def test_stop_regex(backend):
    st = until_digit.run(temperature=0, backend=backend)
    tail = st["tail"]
    assert tail[-1].isdigit() and not re.search(r"[0-9]", tail[:-1])
    assert st.get_meta_info("tail")["finish_reason"] == {"type": "stop", "matched": "[0-9]"}


def test_fork_after_run_and_gather(backend, engine):
    st = few_shot.run(question="What is the capital of France?", temperature=0, backend=backend)
    forks = st.fork(2)  # the state has finished: the fork must neither hang nor fail
    forks += lambda i: f"\nQ: Name a country in Europe number {i + 1}.\nA:" + sgl.gen("country", max_tokens=4,
                                                                                       stop="\n")
    forks.join()
    assert len(st["country"]) == 2
    for i, value in enumerate(st["country"]):
        prompt = st.text() + f"\nQ: Name a country in Europe number {i + 1}.\nA:"
        assert value == _direct(engine, prompt, max_new_tokens=4, stop="\n")
    st += "\nDone."  # appending to a finished state runs at once
    assert st.text().endswith(" Paris\nDone.")


def test_fork_concate_and_append(backend, engine):
    st = parallel_facts.run(temperature=0, backend=backend)
    joined = ("Facts to remember.\nFact 0: Ethan is the father of Liam.\nFact 1: Noah is the father of Julian.\n"
              "Fact 2: Oliver is the father of Carlos.\nQuestion: Who is the father of Julian?\nAnswer:")
    assert st.text() == joined + st["answer"]
    assert st["answer"] == _direct(engine, joined, max_new_tokens=6, stop="\n")


def test_run_batch_and_generator_style(backend):
    questions = ["What is the capital of Japan?", "What is the capital of Egypt?", "What is the capital of Peru?"]
    singles = [few_shot.run(question=q, temperature=0, backend=backend)["answer"] for q in questions]
    states = few_shot.run_batch([{"question": q} for q in questions], temperature=0, backend=backend)
    assert [s["answer"] for s in states] == singles
    gen = few_shot.run_batch([(q,) for q in questions], temperature=0, backend=backend, generator_style=True)
    assert not isinstance(gen, list) and [s["answer"] for s in gen] == singles


def test_backend_calls(backend):
    assert backend.get_model_name()  # the model path (default model: its file) or name
    info = sgl.get_server_info(backend)
    assert info["internal_states"][0]["requests_finished"] > 0 and info["max_total_tokens"] > 0
    sgl.flush_cache(backend)


def test_global_config(engine, capsys):
    cfg = sgl.global_config
    backend = as_backend(engine)
    cfg.default_backend = backend
    try:
        assert sgl.get_default_backend() is backend
        cfg.verbosity = 2
        st = story.run(temperature=0, max_new_tokens=4)
        assert capsys.readouterr().out.strip() == st.text()
    finally:
        cfg.verbosity = 0
        cfg.default_backend = None

    @sgl.function
    def raw_turn(s):
        s += "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\nOK."
        s += sgl.gen("out", max_tokens=2, ignore_eos=True, token_healing=False)

    prompt = "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\nOK."
    kept = _direct(engine, prompt, max_new_tokens=2, ignore_eos=True, skip_special_tokens=False)
    assert "<|im_end|>" in kept  # the model ends its turn at once
    cfg.skip_special_tokens_in_output = False
    try:
        assert raw_turn.run(temperature=0, backend=backend)["out"] == kept
    finally:
        cfg.skip_special_tokens_in_output = True
    skipped = _direct(engine, prompt, max_new_tokens=2, ignore_eos=True)
    assert "<|im_end|>" not in skipped and raw_turn.run(temperature=0, backend=backend)["out"] == skipped
    with pytest.raises(AttributeError, match="no setting"):
        cfg.enable_magic = True
    with pytest.raises(TypeError, match="must be a bool"):
        cfg.enable_parallel_encoding = "yes"


def test_speculative_calls_and_images_are_refused():
    with pytest.raises(ValueError, match="num_api_spec_tokens"):
        @sgl.function(num_api_spec_tokens=64)
        def spec(s):
            s += sgl.gen("x")
    with pytest.raises(NotImplementedError, match="text-only"):
        sgl.image("cat.png")


def test_runtime_and_engine_model_path(tiny_models):
    """sgl.Runtime launches `radixgen serve` as SGLang's launcher does; Engine(model_path=...) as SGLang's."""
    path = str(tiny_models["llama"])
    eng = sgl.Engine(model_path=path, max_total_tokens=2048)
    try:
        local = story.run(temperature=0, max_new_tokens=6, backend=eng).text()
    finally:
        eng.shutdown()
    with sgl.Runtime(model_path=path, max_total_tokens=2048, skip_warmup=True) as rt:
        assert story.run(temperature=0, max_new_tokens=6, backend=rt).text() == local
        assert rt.endpoint.get_model_name() == path
    assert rt.process.poll() is not None  # shut down on leaving the block
    with pytest.raises(RuntimeError, match="unrecognized arguments: --tp-size"):
        sgl.Runtime(model_path=path, tp_size=2)
