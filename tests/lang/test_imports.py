"""The language package's imports: no cycle among its modules (function-level imports included), and
nothing from the runtime's internals (lang/ drives an Engine only through the object it is given)."""

from __future__ import annotations

import ast
from pathlib import Path

LANG = Path(__file__).resolve().parents[2] / "radixgen" / "lang"


def _module_name(path: Path) -> str:
    parts = path.relative_to(LANG.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str] | None = None) -> set[str]:
    """Every module `path` imports, at any depth of its code (`from pkg import submodule`: the
    submodule, when `modules` says it is one)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & (modules or set())
            out.update(subs or {node.module})
    return out


def _graph() -> dict[str, set[str]]:
    """Import edges between lang modules; the edge from a module up to its own package (Python
    initializes the package first, whoever imports what) is not a dependency and is left out."""
    files = {_module_name(p): p for p in LANG.rglob("*.py")}
    return {name: {m for m in _imports(path, set(files)) if m in files and m != name
                   and not name.startswith(m + ".")} for name, path in files.items()}


def test_lang_imports_no_runtime_internals():
    for path in LANG.rglob("*.py"):
        bad = sorted(m for m in _imports(path) if m.startswith("radixgen.runtime"))
        assert not bad, f"{path.name} imports {bad}: lang/ uses the Engine object it is given, not runtime modules"


def test_lang_has_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
