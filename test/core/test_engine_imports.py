"""The engine's modules import without a cycle: the static import graph of flashrt_core/engine/ (imports under
`if TYPE_CHECKING:` left out: annotations only, and every function-level import counted) is acyclic."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "flashrt_core" / "engine"
MODULES = sorted(p.stem for p in ENGINE.glob("*.py") if p.stem != "__init__")


def _runtime_imports(module: str) -> set[str]:
    """The engine modules `module` imports at run time (relative or absolute), TYPE_CHECKING blocks left out."""
    tree = ast.parse((ENGINE / f"{module}.py").read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1:
                names = [base] if base else [a.name for a in node.names]
            elif base.startswith("flashrt_core.engine"):
                rest = base[len("flashrt_core.engine"):].lstrip(".")
                names = [rest] if rest else [a.name for a in node.names]
            else:
                names = []
            found.update(n.split(".")[0] for n in names if n.split(".")[0] in MODULES)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("flashrt_core.engine."):
                    found.add(a.name.split(".")[2])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def test_the_engine_import_graph_is_acyclic():
    graph = {m: _runtime_imports(m) for m in MODULES}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for dep in sorted(graph[m]):
            visit(dep, path + [m])
        state[m] = 2

    for m in MODULES:
        visit(m, [])
    assert graph["forward"] >= {"ops"} and "graph_executor" not in graph["ops"]     # the graph is really read
