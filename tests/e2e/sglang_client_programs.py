"""SGLang programs run by SGLang's own frontend (`pip install sglang`) against a `radixgen serve`.

Run by tests/e2e/test_sglang_client.py with the python of a venv holding only the sglang package and
the few pure-Python modules its `lang` package imports (no torch, no radixgen):

    python sglang_client_programs.py http://127.0.0.1:PORT   ->   one JSON object on stdout

Every construct is written the SGLang way; the test checks the results against the server's own
/generate and against the programs' texts.
"""

import importlib.util
import json
import sys
import time

import sglang as sgl

FEW_SHOT = ("Q: What is the capital of Italy?\nA: Rome\n"
            "Q: What is the capital of Spain?\nA: Madrid\n"
            "Q: What is the capital of Germany?\nA: Berlin\n")


@sgl.function
def qa(s, question):
    s += FEW_SHOT + "Q: " + question + "\nA:"
    s += sgl.gen("answer", max_tokens=8, stop="\n")


@sgl.function
def capital_select(s):
    s += "The capital city of France is"
    s += sgl.select("city", choices=[" Paris", " London", " Berlin", " Madrid"])


@sgl.function
def regex_fields(s):
    s += "A phone number in the form 555-1234: "
    s += sgl.gen("phone", max_tokens=12, regex=r"[0-9]{3}-[0-9]{4}")
    s += "\nThe number of days in a week: "
    s += sgl.gen_int("days", max_tokens=6)


@sgl.function
def fork_gather(s):
    s += "Three fruits, one per line.\n"
    forks = s.fork(3)
    forks += lambda i: f"Fruit {i + 1}:" + sgl.gen("fruit", max_tokens=5, stop="\n")
    forks.join()


@sgl.function
def fork_concat(s):
    s += "Facts to remember.\n"
    facts = ["Ethan is the father of Liam.", "Noah is the father of Julian.", "Oliver is the father of Carlos."]
    forks = s.fork(len(facts))
    forks += lambda i: f"Fact {i}: " + facts[i] + "\n"
    forks.join(mode="concate_and_append")
    s += "Question: Who is the father of Julian?\nAnswer:" + sgl.gen("answer", max_tokens=6, stop="\n")


@sgl.function
def story(s):
    s += "Once upon a time, in a small village by the sea,"
    s += sgl.gen("story", max_tokens=24)


@sgl.function
def until_digit(s):
    s += "Count with words and then digits: one, two, three, 4"
    s += sgl.gen("tail", max_tokens=24, stop_regex=r"[0-9]")


@sgl.function
def logprobs(s):
    s += "The capital of France is"
    s += sgl.gen("lp", max_tokens=3, return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=True)


@sgl.function
def chat(s, question):
    s += sgl.system("You are a terse assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=12))


def state_dict(state, *names):
    return {"text": state.text(), "error": repr(state.error()) if state.error() else None,
            "vars": {n: state[n] for n in names}, "meta": {n: state.get_meta_info(n) for n in names},
            "messages": state.messages()}


def flush_when_idle(backend, timeout=60.0):
    """sgl's flush_cache fails (HTTP 400, as on SGLang's server) while requests are in flight: retry."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            backend.flush_cache()
            return True
        except RuntimeError as e:
            if "cache_busy" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(url):
    backend = sgl.RuntimeEndpoint(url, chat_template_name="chatml")
    sgl.set_default_backend(backend)
    out = {"torch_importable": importlib.util.find_spec("torch") is not None,
           "radixgen_importable": importlib.util.find_spec("radixgen") is not None,
           "model_name": backend.get_model_name(), "server_info_keys": sorted(backend.get_server_info())}
    out["qa"] = state_dict(qa.run(question="What is the capital of France?", temperature=0), "answer")
    out["select"] = state_dict(capital_select.run(), "city")
    out["regex"] = state_dict(regex_fields.run(temperature=0), "phone", "days")
    out["fork_gather"] = state_dict(fork_gather.run(temperature=0), "fruit")
    out["fork_concat"] = state_dict(fork_concat.run(temperature=0), "answer")
    out["chat"] = state_dict(chat.run(question="Name one colour.", temperature=0), "answer")

    out["stop_regex"] = state_dict(until_digit.run(temperature=0), "tail")
    out["logprobs"] = state_dict(logprobs.run(temperature=0), "lp")
    out["story"] = state_dict(story.run(temperature=0), "story")
    streamed = story.run(temperature=0, stream=True)
    out["stream_var_chunks"] = list(streamed.text_iter("story"))
    streamed = story.run(temperature=0, stream=True)
    out["stream_text_chunks"] = list(streamed.text_iter())
    out["stream_text"] = streamed.text()

    questions = ["What is the capital of Japan?", "What is the capital of Egypt?", "What is the capital of Peru?"]
    states = qa.run_batch([{"question": q} for q in questions], temperature=0)
    out["batch"] = [state_dict(st, "answer") for st in states]
    out["batch_questions"] = questions

    out["flushed"] = flush_when_idle(backend)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
