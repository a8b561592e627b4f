"""Quickstart: roles, gen and select on the default model (SmolLM2-135M-Instruct, CPU).

Run: python examples/quickstart.py   (or `make demo`)
"""

import time

import radixgen as sgl


@sgl.function
def assistant_turn(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=48, stop="\n\n"))
    s += sgl.user("Was your answer about a place, a person or a thing?")
    s += sgl.assistant(sgl.select("kind", choices=["a place", "a person", "a thing"]))


def main() -> None:
    engine = sgl.Engine()
    sgl.set_default_backend(engine)
    t0 = time.perf_counter()
    questions = ["What is the capital of France?", "Who wrote Romeo and Juliet?"]
    states = assistant_turn.run_batch([{"question": q} for q in questions], temperature=0, progress_bar=False)
    elapsed = time.perf_counter() - t0
    tokens = 0
    for q, state in zip(questions, states, strict=True):
        state.sync()
        print(f"Q: {q}\nA: {state['answer'].strip()}\n   kind: {state['kind']}")
        for call in state.trace():
            tokens += call["completion_tokens"]
            print(f"   {call['kind']:6} {call['name']:7} prompt={call['prompt_tokens']:4} "
                  f"cached={call['cached_tokens']:4} new={call['completion_tokens']:3}")
    print(f"{tokens} generated tokens in {elapsed:.1f} s ({tokens / elapsed:.1f} tok/s incl. prefill)")
    engine.shutdown()


if __name__ == "__main__":
    main()
