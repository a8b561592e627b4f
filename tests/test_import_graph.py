"""The package's import graph: no cycles (lazy imports included), the four libraries under the
runtime never import it, and the language reaches the runtime only through the Engine's public API.

Imports are read from the source with `ast` (module-level, function-level and TYPE_CHECKING ones
alike), so a cycle hidden behind a lazy import is still a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import radixgen

ROOT = Path(radixgen.__file__).parent
LIBRARIES = ("radixgen.grammar", "radixgen.sampling", "radixgen.radix_cache", "radixgen.common")
LANG_MAY_IMPORT = {"radixgen.runtime.engine"}  # the Engine, its public API


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """radixgen modules `path` imports (a `from pkg import name` of a submodule counts as that submodule)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
    return {m for m in out if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {m: imports_of(p, set(files)) for m, p in files.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def parents(module: str) -> set[str]:
    """A package's __init__ runs before its submodules: importing a.b.c imports a.b and a."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_import_cycles():
    g = graph()
    # a package's __init__ importing its own submodules is how packages work, not a cycle
    g = {m: {d for d in deps if m not in parents(d)} for m, deps in g.items()}
    assert cycles(g) == []


def test_libraries_do_not_import_the_runtime_or_the_language():
    bad = {(m, d) for m, deps in graph().items() if m.startswith(LIBRARIES) for d in deps
           if d.startswith(("radixgen.runtime", "radixgen.lang"))}
    assert bad == set()


def test_the_language_uses_only_the_engine_api():
    bad = {(m, d) for m, deps in graph().items() if m.startswith("radixgen.lang") for d in deps
           if d.startswith("radixgen.runtime") and d not in LANG_MAY_IMPORT}
    assert bad == set()


def test_the_checker_sees_lazy_imports_and_cycles():
    """Not vacuous: an import inside a function is an edge, and mutual imports form a cycle."""
    assert "radixgen.runtime.layers.attention.triton_backend" in graph()["radixgen.runtime.layers.attention"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
