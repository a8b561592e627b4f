"""Tree of thought with fork/join: three branches propose approaches to one question, the program gathers
them and lets the model `select` the best one.

`s.fork(3)` makes three copies of the state that share the text so far; the runtime prefills that shared
prefix once, so each branch's `gen` finds it in the radix cache (see the cached-token counts printed).
`join()` (mode "gather_variable") turns each branch variable into a list in the parent.

Run: python examples/fork_tree_of_thought.py
"""

import radixgen as sgl

QUESTION = ("A farmer has 17 sheep. All but 9 run away. How many sheep does the farmer have left? "
            "Think of one way to solve this.")
STYLES = ["Read the question word by word.", "Write it as a subtraction.", "Imagine the sheep."]


@sgl.function
def tree_of_thought(s, question):
    s += sgl.system("You are a careful problem solver.")
    s += sgl.user(question)
    forks = s.fork(len(STYLES))  # the text so far is computed once and shared by the branches
    # `forks += f` applies f(i) to branch i; sampling (temperature > 0) makes the branches differ further.
    forks += lambda i: sgl.assistant(f"Approach {i + 1}: {STYLES[i]} " + sgl.gen("approach", stop="\n",
                                                                                  temperature=0.8))
    forks.join()  # gather_variable: s["approach"] is now a list, one entry per branch
    listing = "\n".join(f"{i + 1}. {STYLES[i]} {a.strip()}" for i, a in enumerate(s["approach"]))
    s += sgl.user(f"Here are {len(STYLES)} approaches:\n{listing}\nWhich approach is the best? Reply with its number.")
    s += sgl.assistant("The best approach is number " + sgl.select("best", choices=["1", "2", "3"]))


def main(max_tokens: int | None = None) -> sgl.ProgramState:
    """max_tokens: budget of each branch's approach (default 48). Returns the finished state."""
    engine = sgl.Engine()
    sgl.set_default_backend(engine)
    state = tree_of_thought.run(question=QUESTION, max_new_tokens=max_tokens or 48)
    state.sync()  # re-raises an error from inside the program (or a branch), if any
    for i, approach in enumerate(state["approach"]):
        print(f"branch {i + 1}: {STYLES[i]} {approach.strip()}")
    scores = state.get_meta_info("best").get("scores")  # one score per choice
    print(f"best: approach {state['best']}" + (f"  (scores {[round(x, 2) for x in scores]})" if scores else ""))
    # One trace record per gen/select; the branches' records carry their fork path in "branch".
    for call in state.trace():
        where = f"branch {call['branch'][0] + 1}" if call["branch"] else "parent"
        print(f"  {call['kind']:6} {call['name']:8} {where:8} prompt={call['prompt_tokens']:4} "
              f"cached={call['cached_tokens']:4} new={call['completion_tokens']:3}")
    print("each branch found the shared prefix (system + question) in the cache: it was computed once")
    engine.shutdown()
    return state


if __name__ == "__main__":
    main()
