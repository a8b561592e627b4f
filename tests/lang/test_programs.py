"""@function programs end to end on the real default model (one shared Engine, greedy decoding)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest

import radixgen as sgl
from radixgen.lang.interpreter import ProgramError

pytestmark = pytest.mark.slow

FEW_SHOT = ("Q: What is the capital of Italy?\nA: Rome\n"
            "Q: What is the capital of Spain?\nA: Madrid\n"
            "Q: What is the capital of Germany?\nA: Berlin\n")


@pytest.fixture(autouse=True)
def _default_backend(backend):
    sgl.set_default_backend(backend)
    yield
    sgl.set_default_backend(None)


@sgl.function
def few_shot_qa(s, question):
    s += FEW_SHOT + "Q: " + question + "\nA:"
    s += sgl.gen("answer", max_tokens=8, stop="\n")


def test_import_is_light():
    code = "import sys, radixgen; assert 'torch' not in sys.modules and 'openai' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_few_shot_qa_with_stop():
    s = few_shot_qa.run(question="What is the capital of France?", temperature=0)
    assert s.error() is None
    answer = s["answer"]
    assert "\n" not in answer and answer.strip()
    assert s.text() == FEW_SHOT + "Q: What is the capital of France?\nA:" + answer
    meta = s.get_meta_info("answer")
    assert meta["finish_reason"]["type"] in ("stop", "length") and meta["completion_tokens"] <= 9
    (rec,) = s.trace()
    assert rec["name"] == "answer" and rec["prompt_tokens"] > 50 and rec["latency_s"] > 0
    assert set(rec) >= {"prompt_tokens", "cached_tokens", "completion_tokens", "latency_s"}


def test_multi_turn_chat_uses_the_chat_template(engine):
    @sgl.function
    def chat(s):
        s += sgl.user("Say hi.")
        s += sgl.assistant(sgl.gen("a1", max_tokens=12))
        with s.user():
            s += "Now say bye."
        s.assistant_begin()
        s += sgl.gen("a2", max_tokens=12)
        s.assistant_end()

    s = chat.run(temperature=0)
    msgs = s.messages()
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[1]["content"] == s["a1"] and msgs[3]["content"] == s["a2"]
    assert "<|im_end|>" not in s["a1"]
    text = s.text()
    assert text.count("You are a helpful AI assistant named SmolLM") == 1  # default system prompt once
    assert text.startswith("<|im_start|>system\n")
    assert text == engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=False)

    @sgl.function
    def nested(s):
        with s.user():
            s += sgl.assistant("x")

    bad = nested.run()
    assert isinstance(bad.error(), ValueError) and "nested roles" in str(bad.error())


def test_select_among_three_labels(engine):
    labels = ["positive", "negative", "neutral"]

    @sgl.function
    def classify(s, review):
        s += "Review: " + review + "\nSentiment (positive, negative or neutral): "
        s += sgl.select("label", choices=labels)

    s = classify.run(review="I loved this movie, it was wonderful!")
    assert s["label"] in labels
    meta = s.get_meta_info("label")
    assert len(meta["scores"]) == 3 and meta["method"] == "token_length_normalized"
    assert meta["scores"][labels.index(s["label"])] == max(meta["scores"])
    # token healing at the boundary: the prompt ends with a space, so each scored token run starts
    # with the merged " <label>" token, not a lone "<label>" after a lone " ".
    for ids, label in zip(meta["choice_token_ids"], labels, strict=True):
        assert engine.tokenizer.decode(ids) == " " + label
    assert s.text().endswith(": " + s["label"])
    s2 = classify.run(review="The food was cold and awful.",
                      ).get_meta_info("label")  # the scoring call reused the cached prefix
    assert s2["cached_tokens"] > 0
    for method in (sgl.greedy_token_selection, sgl.unconditional_likelihood_normalized):
        @sgl.function
        def pick(s, m=method):
            s += "The opposite of hot is"
            s += sgl.select("w", ["cold", "warm", "banana"], choices_method=m)

        assert pick.run()["w"] in ("cold", "warm", "banana")


def test_gen_int_and_dtype(needs_constraints):
    @sgl.function
    def ints(s):
        s += "How many legs does a dog have? Answer with a number: "
        s += sgl.gen_int("n", max_tokens=6)
        s += "\nIs a dog a mammal? "
        s += sgl.gen("b", dtype=bool, max_tokens=3)

    s = ints.run(temperature=0)
    assert s.error() is None
    int(s["n"])
    assert s["b"] in ("True", "False")


def test_regex_gen_full_match(needs_constraints):
    @sgl.function
    def date(s):
        s += "Today's date in ISO format is "
        s += sgl.gen("d", regex=r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", max_tokens=12)

    s = date.run(temperature=0)
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", s["d"])


def test_json_schema_gen_validates(needs_constraints):
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}

    @sgl.function
    def person(s):
        s += "A person as JSON: "
        s += sgl.gen("p", json_schema=schema, max_tokens=40)

    s = person.run(temperature=0)
    jsonschema.validate(json.loads(s["p"]), schema)


def test_fork_join_shares_the_prefix(engine):
    tok = engine.tokenizer
    prefix = FEW_SHOT * 2 + "Here are four more capital cities, one per line.\n"

    @sgl.function
    def branches(s, mode):
        s += prefix
        forks = s.fork(4)
        forks += lambda i: f"City {i + 1}:" + sgl.gen("city", max_tokens=4, stop="\n")
        forks.join(mode=mode)

    s = branches.run(mode="gather_variable", temperature=0)
    assert s.error() is None
    cities = s["city"]
    assert isinstance(cities, list) and len(cities) == 4
    recs = s.trace()
    assert sorted(r["branch"][0] for r in recs) == [0, 1, 2, 3]
    n_prefix = len(tok.encode(prefix))
    for r in recs:  # every branch found the shared prefix in the cache: computed once, before the fork
        assert r["cached_tokens"] >= n_prefix - 2, (r, n_prefix)
    assert s.text() == prefix

    s = branches.run(mode="concate_and_append", temperature=0)
    text = s.text()
    assert text.startswith(prefix) and all(f"City {i}:" in text for i in range(1, 5))
    assert "city" not in s

    from radixgen.lang.viz import render_html

    html = render_html(s)
    assert html.startswith("<!DOCTYPE html>") and "fork &times;4" in html and "branch 3" in html


def test_var_scope_and_bind():
    @sgl.function
    def scoped(s, topic):
        s += "Topic: " + topic + "\n"
        with s.var_scope("line"):
            s += "A fact: "
            s += sgl.gen("fact", max_tokens=5, stop="\n")

    s = scoped.bind(topic="the Moon").run(temperature=0)
    assert s["line"] == "A fact: " + s["fact"]
    assert s.text() == "Topic: the Moon\n" + s["line"]


def test_streaming_text_iter_equals_final_text():
    state = few_shot_qa.run(question="What is the capital of Japan?", temperature=0, stream=True)
    chunks = list(state.text_iter())
    assert "".join(chunks) == state.text() and len(chunks) > 1
    state = few_shot_qa.run(question="What is the capital of Japan?", temperature=0, stream=True)
    parts = list(state.text_iter("answer"))
    assert "".join(parts) == state["answer"]

    async def collect():
        st = few_shot_qa.run(question="What is the capital of Peru?", temperature=0, stream=True)
        return [c async for c in st.text_async_iter("answer")], st

    parts, st = asyncio.run(collect())
    assert "".join(parts) == st["answer"]


def test_run_batch_of_64(engine, capsys):
    @sgl.function
    def tiny(s, i):
        s += FEW_SHOT  # constant: run_batch finds it by tracing (f-strings of arguments stop the trace)
        s += f"Q: What is {i} plus one?\nA:"
        s += sgl.gen("a", max_tokens=3, stop="\n")

    states = tiny.run_batch([{"i": i} for i in range(64)], temperature=0, progress_bar=True)
    assert len(states) == 64 and all(st.error() is None for st in states)
    for i, st in enumerate(states):  # input order
        assert f"What is {i} plus one?" in st.text()
    # the constant prefix (found by tracing) was cached before the batch: every program hit it
    n_prefix = len(engine.tokenizer.encode(FEW_SHOT))
    assert all(st.trace()[0]["cached_tokens"] >= n_prefix - 1 for st in states)
    assert "64/64" in capsys.readouterr().err


def test_react_loop_with_a_python_tool():
    def calculator(expr: str) -> str:
        try:
            return str(eval(expr, {"__builtins__": {}}))  # a toy tool
        except Exception as e:
            return f"error: {e}"

    @sgl.function
    def react(s, question):
        s += "Answer the question using the calculator tool.\nQuestion: " + question + "\n"
        for step in range(3):
            s += f"Step {step + 1} action: "
            s += sgl.select("action", ["calculate", "finish"])
            if s["action"] == "finish":
                break
            s += "\nExpression: "
            s += sgl.gen("expr", max_tokens=8, stop="\n")
            s += "\nObservation: " + calculator(s["expr"]) + "\n"
        s += "\nFinal answer:" + sgl.gen("final", max_tokens=6, stop="\n")

    s = react.run(question="What is 12 * 7?", temperature=0)
    assert s.error() is None
    assert s["action"] in ("calculate", "finish") and "final" in s
    assert sum(r["kind"] == "select" for r in s.trace()) >= 1


def test_errors_surface_and_run_batch_continues():
    @sgl.function
    def fails(s, i):
        s += "Count: 1, 2,"
        s += sgl.gen("x", max_tokens=2)
        if i % 2:
            raise ValueError(f"tool failed on {i}")
        s += sgl.gen("y", max_tokens=2)

    st = fails.run(i=1)
    assert isinstance(st.error(), ValueError)
    with pytest.raises(ProgramError) as info:
        st.sync()
    assert isinstance(info.value.__cause__, ValueError)
    assert st["x"]  # computed before the failure
    with pytest.raises(ProgramError):
        st["y"]  # never computed: raises instead of hanging

    states = fails.run_batch([{"i": i} for i in range(6)], temperature=0)
    assert [st.error() is None for st in states] == [True, False] * 3
    assert all(st["y"] is not None for st in states[::2])

    @sgl.function
    def bad_params(s):
        s += "Hi"
        s += sgl.gen("x", max_tokens=2, temperature=-1.0)  # the engine rejects it: an error, no hang

    st = bad_params.run()
    assert st.error() is not None
    with pytest.raises(ProgramError):
        st["x"]


def test_token_healing_after_a_trailing_space(needs_constraints):
    @sgl.function
    def healed(s):
        s += FEW_SHOT + "Q: What is the capital of France?\nA: "
        s += sgl.gen("answer", max_tokens=4, stop="\n")

    s = healed.run(temperature=0)
    assert s.get_meta_info("answer").get("token_healing") == " "
    assert not s["answer"].startswith(" ") and s["answer"].strip()


def test_select_scores_match_a_full_recompute(engine, backend):
    """The cached-prefix, batched scoring equals scoring prompt + choice from scratch."""
    from radixgen.lang.backends.base import Context

    text = FEW_SHOT + "Q: What is the capital of France?\nA: "
    choices = ["Paris", "Lyon", "Marseille"]
    d = backend.select(Context(text), choices, 0.0, sgl.token_length_normalized)
    for ids, lps in zip(d.meta_info["choice_token_ids"], d.meta_info["token_logprobs"], strict=True):
        full = engine.tokenizer.encode(text)[:-1] + ids  # the trailing " " merged into the choice
        out = engine.generate(input_ids=full, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                              logprob_start_len=0)
        ref = [lp for lp, _ in out["meta_info"]["input_token_logprobs"][-len(ids):]]
        assert lps == pytest.approx(ref, abs=1e-3)
    assert d.decision == "Paris"


def test_token_healing_plan(engine):
    """Which gens get healed and how (the regex that constrains the first token)."""
    from radixgen.lang.backends.base import Context
    from radixgen.lang.backends.engine import EngineBackend
    from radixgen.lang.ir import SamplingParams

    be = EngineBackend(engine)
    be._constraints = True  # plan as if the engine enforced regexes (probed separately)
    text = "The capital of France is "
    kw, healed = be._prompt_kwargs(Context(text), SamplingParams(max_new_tokens=4))
    assert healed == " " and kw["input_ids"] == engine.tokenizer.encode(text)[:-1]
    assert kw["sampling_params"]["regex"] == r" [\s\S]*" and kw["sampling_params"]["max_new_tokens"] == 5
    not_healed = [
        (Context(text), SamplingParams(token_healing=False)),
        (Context(text), SamplingParams(regex="[a-z]+")),
        (Context(text), SamplingParams(stop=(" ",))),  # a stop string inside the healed text
        (Context("<|im_start|>user\n", role="user", role_text=""), SamplingParams()),  # template boundary
        (Context("Hi<|im_end|>"), SamplingParams()),  # special token
    ]
    for ctx, params in not_healed:
        assert be._prompt_kwargs(ctx, params)[1] == "", (ctx, params)


def test_healing_regex_accepts_merged_tokens(engine):
    xgr = pytest.importorskip("xgrammar")
    from radixgen.lang.backends.engine import regex_literal

    tok = engine.tokenizer
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok.hf, vocab_size=tok.vocab_size))
    for healed, cont in [(" ", " Paris is"), (":", ": yes"), ("\n", "\n\nQ"), ("(", "(a+b)"), ('."', '." he')]:
        matcher = xgr.GrammarMatcher(compiler.compile_regex(regex_literal(healed) + r"[\s\S]*"))
        assert all(matcher.accept_token(t) for t in tok.encode(cont)), healed
        bad = xgr.GrammarMatcher(compiler.compile_regex(regex_literal(healed) + r"[\s\S]*"))
        assert not all(bad.accept_token(t) for t in tok.encode("zzz" + cont))
