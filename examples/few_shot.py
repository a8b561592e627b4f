"""Few-shot QA in a batch: the shared few-shot prefix is computed once and reused from the radix cache.

`run_batch` traces the program, finds the constant prefix (instruction + examples), prefills it once,
then runs every question on top of it; each answer's meta info shows how many prompt tokens were cached.

Run: python examples/few_shot.py
"""

import time

import radixgen as sgl

EXAMPLES = [
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Japan?", "Tokyo"),
]


@sgl.function
def few_shot_qa(s, question):
    # Constant text first: this whole block is the same for every item of the batch.
    s += "Answer each question with one or two words.\n\n"
    for q, a in EXAMPLES:
        s += f"Q: {q}\nA: {a}\n\n"
    # The per-item part: only these tokens (and the answer) are new for each question.
    s += "Q: " + question + "\nA:"
    s += sgl.gen("answer", stop="\n")  # no max_tokens here: the run's max_new_tokens applies


def main(max_tokens: int | None = None) -> list[sgl.ProgramState]:
    """max_tokens: the budget of each answer (default 16). Returns the finished states."""
    engine = sgl.Engine()
    sgl.set_default_backend(engine)
    questions = [
        "What is the capital of France?",
        "What is the capital of Egypt?",
        "What is the capital of Canada?",
        "What is the capital of Kenya?",
    ]
    t0 = time.perf_counter()
    states = few_shot_qa.run_batch([{"question": q} for q in questions], max_new_tokens=max_tokens or 16,
                                   temperature=0, progress_bar=True)
    elapsed = time.perf_counter() - t0
    for q, state in zip(questions, states, strict=True):
        state.sync()  # re-raises an error from inside the program, if any
        meta = state.get_meta_info("answer")
        print(f"Q: {q}\nA: {state['answer'].strip()}\n   prompt={meta['prompt_tokens']} "
              f"cached={meta['cached_tokens']} new={meta['completion_tokens']}")
    print(f"{len(questions)} answers in {elapsed:.1f} s; the few-shot prefix was prefilled once and then cached")
    engine.shutdown()
    return states


if __name__ == "__main__":
    main()
