"""A ReAct-style agent loop: the model thinks, `select`s an action among Search / Calculate / Finish,
a Python tool runs, and its observation is fed back, until Finish or a step limit.

The tools are local and safe: "search" looks words up in a small dict, "calculate" evaluates arithmetic
by walking its `ast` (numbers and + - * / ** only; no eval of arbitrary code). The tool inputs are
regex-constrained, so the calculator always receives something made of digits and operators.

Run: python examples/react_agent.py
"""

import ast
import operator

import radixgen as sgl

ACTIONS = ["Search", "Calculate", "Finish"]
MAX_STEPS = 4
INPUT_TOKENS = 24  # tool inputs are short, bounded patterns ending in "]"
INPUT_REGEX = {"Search": r"[A-Za-z ]{1,30}\]", "Calculate": r"[0-9+*/(). -]{1,30}\]"}

FACTS = {
    "france": "France is a country in Europe. Its capital is Paris. It has about 68 million people.",
    "paris": "Paris is the capital of France. About 2 million people live in the city itself.",
    "japan": "Japan is an island country in Asia. Its capital is Tokyo. It has about 124 million people.",
    "tokyo": "Tokyo is the capital of Japan. About 14 million people live there.",
}

EXAMPLE = """Question: How many people live in Japan and France together?
Thought: I should search for the population of Japan.
Action: Search[Japan]
Observation: Japan is an island country in Asia. Its capital is Tokyo. It has about 124 million people.
Thought: I should search for the population of France.
Action: Search[France]
Observation: France is a country in Europe. Its capital is Paris. It has about 68 million people.
Thought: I should calculate the sum of the two numbers.
Action: Calculate[124 + 68]
Observation: 192
Thought: I know the answer, so I should finish.
Action: Finish
Answer: About 192 million people.

"""


def search(query: str) -> str:
    """The "search engine": the first fact whose key word appears in the query."""
    for word in query.lower().split():
        if word in FACTS:
            return FACTS[word]
    return f"No results for {query!r}."


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """Arithmetic only: numbers, + - * / ** and parentheses, checked node by node (never eval)."""
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"not arithmetic: {ast.dump(node)[:40]}")

    try:
        value = walk(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
        return f"Error: {e}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


TOOLS = {"Search": search, "Calculate": calculate}


@sgl.function
def react(s, question, max_steps):
    s += "Answer the question with the tools Search and Calculate, then Finish.\n\n" + EXAMPLE
    s += f"Question: {question}\n"
    for step in range(max_steps):
        s += "Thought: " + sgl.gen(f"thought{step}", stop="\n") + "\n"
        s += "Action: " + sgl.select(f"action{step}", choices=ACTIONS)
        action = s[f"action{step}"]  # waits for the select: the loop branches on the model's choice
        if action == "Finish":
            s += "\nAnswer: " + sgl.gen("answer", stop="\n")
            return
        s += "[" + sgl.gen(f"input{step}", regex=INPUT_REGEX[action], max_tokens=INPUT_TOKENS)
        tool_input = s[f"input{step}"].removesuffix("]")
        s[f"observation{step}"] = observation = TOOLS[action](tool_input)  # Python runs the tool
        s += "\nObservation: " + observation + "\n"


def main(max_tokens: int | None = None) -> dict:
    """max_tokens: budget of each thought and of the answer (default 32). Returns a summary of the run."""
    engine = sgl.Engine()
    sgl.set_default_backend(engine)
    question = "How many people live in Paris and Tokyo together?"
    state = react.run(question=question, max_steps=MAX_STEPS, max_new_tokens=max_tokens or 32, temperature=0)
    state.sync()  # re-raises an error from inside the program, if any
    steps = []
    print(f"Question: {question}")
    for step in range(MAX_STEPS):
        if f"action{step}" not in state:
            break
        action = state[f"action{step}"]
        steps.append(action)
        print(f"[{step + 1}] Thought: {state[f'thought{step}'].strip()}\n    Action: {action}", end="")
        if action != "Finish":
            print(f"[{state[f'input{step}']}\n    Observation: {state[f'observation{step}']}", end="")
        print()
    finished = "answer" in state
    print(f"Answer: {state['answer'].strip()}" if finished else f"stopped after {MAX_STEPS} steps without Finish")
    engine.shutdown()
    return {"steps": steps, "finished": finished, "answer": state["answer"] if finished else None}


if __name__ == "__main__":
    main()
