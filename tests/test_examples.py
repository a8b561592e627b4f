"""Every examples/*.py runs to completion on the real default model, with small token budgets.

One process, one Engine: each example module is imported and its `main(max_tokens=...)` called (plain
`main()` for the examples without that parameter), with `sgl.Engine` patched to return the session's
shared engine (tests/conftest.py) whose `shutdown` does nothing. The assertions check structure (formats,
list lengths, step limits), never the model's exact words. openai_client.py needs a server: skipped here.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

import radixgen as sgl

pytestmark = pytest.mark.slow

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
SKIP = {"openai_client.py",  # needs a running server; covered by its own test
        "tour.py"}  # the README's tour, a plain script: tests/e2e/test_readme.py runs it
EXAMPLES = sorted(p.name for p in EXAMPLES_DIR.glob("*.py") if p.name not in SKIP)
MAX_TOKENS = 12


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{Path(name).stem}", EXAMPLES_DIR / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def shared_engine(engine, monkeypatch):
    """`sgl.Engine()` inside the examples -> the session engine, kept open across examples."""
    def factory(*args, **kwargs):
        assert not args and not kwargs, "examples run on the default model: sgl.Engine() without arguments"
        return engine

    monkeypatch.setattr(sgl, "Engine", factory)
    monkeypatch.setattr(engine, "shutdown", lambda: None)
    yield engine
    sgl.set_default_backend(None)


def run_example(name: str):
    module = load(name)
    if "max_tokens" in inspect.signature(module.main).parameters:
        return module, module.main(max_tokens=MAX_TOKENS)
    return module, module.main()


# ---- per-example structural checks: (module, main's return value, captured stdout, captured stderr)

def check_few_shot(m, states, out, err):
    assert len(states) == 4
    for state in states:
        assert state.error() is None and "\n" not in state["answer"]
        meta = state.get_meta_info("answer")
        assert 0 < meta["completion_tokens"] <= MAX_TOKENS + 1
        assert meta["cached_tokens"] >= 50  # the few-shot prefix came from the cache
    assert "4/4" in err  # the progress bar


def check_regex_fields(m, fields, out, err):
    for name, pattern in (("date", m.DATE), ("email", m.EMAIL), ("phone", m.PHONE)):
        assert re.fullmatch(pattern, fields[name]), (name, fields[name])
    assert type(fields["people"]) is int and type(fields["cost"]) is float


def check_fork_tree_of_thought(m, state, out, err):
    approaches = state["approach"]
    assert isinstance(approaches, list) and len(approaches) == len(m.STYLES)
    assert state["best"] in ("1", "2", "3")
    branch_calls = [c for c in state.trace() if c["branch"]]
    assert sorted(c["branch"][0] for c in branch_calls) == [0, 1, 2]
    for c in branch_calls:  # every branch found the shared prefix in the cache
        assert c["cached_tokens"] > 20 and c["completion_tokens"] <= MAX_TOKENS + 1


def check_react_agent(m, summary, out, err):
    steps = summary["steps"]
    assert steps and set(steps) <= set(m.ACTIONS)
    assert "Finish" not in steps[:-1]  # the loop stops at the first Finish
    assert summary["finished"] == (steps[-1] == "Finish")
    assert summary["finished"] or len(steps) == m.MAX_STEPS
    assert out.count("Observation:") == sum(a != "Finish" for a in steps)


def check_parallel_tools(m, result, out, err):
    assert len(result["cities"]) == len(result["results"]) == len(result["tips"]) == len(m.TOOLS)
    for (_, tool), city, value in zip(m.TOOLS, result["cities"], result["results"], strict=True):
        assert city in m.CITIES and value == tool(city)  # each branch got its own tool's result
    assert len(result["timings"]) == len(m.TOOLS)


def check_ebnf_grammar(m, results, out, err):
    assert {r["grammar"] for r in results} == {"arithmetic", "yes/no"}
    for r in results:
        assert r["finish"] in ("stop", "length")
        if r["finish"] == "length":
            continue
        if r["grammar"] == "arithmetic":
            assert re.fullmatch(r"[0-9()*/+\- ]+", r["text"])
            try:
                m.evaluate(r["text"])  # parses as an expression of the grammar
            except ZeroDivisionError:
                pass
        else:
            assert re.fullmatch(m.YES_NO_REGEX, r["text"]), r["text"]


CHECKS = {"few_shot.py": check_few_shot, "regex_fields.py": check_regex_fields,
          "fork_tree_of_thought.py": check_fork_tree_of_thought, "react_agent.py": check_react_agent,
          "parallel_tools.py": check_parallel_tools, "ebnf_grammar.py": check_ebnf_grammar}


@pytest.mark.timeout(180)  # a hung request fails this example instead of the whole run
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, shared_engine, capsys):
    module, result = run_example(name)
    out, err = capsys.readouterr()
    assert out.strip(), f"{name} printed nothing"
    if name in CHECKS:
        CHECKS[name](module, result, out, err)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_shape(name):
    """Module docstring with a Run: line, a main() taking max_tokens (the two original examples
    excepted), and the __main__ guard."""
    source = (EXAMPLES_DIR / name).read_text()
    module = load(name)
    assert module.__doc__ and "Run: python examples/" in module.__doc__
    assert 'if __name__ == "__main__":\n    main()' in source
    params = inspect.signature(module.main).parameters
    if name not in ("quickstart.py", "json_extract.py"):
        assert "max_tokens" in params and params["max_tokens"].default is None, \
            f"{name}: main must take `max_tokens: int | None = None` (the test runs it with a small budget)"


def test_react_calculator_is_safe():
    m = load("react_agent.py")
    assert m.calculate("2 * (3 + 4)") == "14" and m.calculate("7 / 2") == "3.5"
    for bad in ("__import__('os').system('true')", "abs(-1)", "x + 1", "2 ** 10000", "1 / 0"):
        assert m.calculate(bad).startswith("Error"), bad
    assert m.search("population of Tokyo") == m.FACTS["tokyo"]
    assert m.search("Mars").startswith("No results")
