"""The engine's structure, as vLLM v1 lays it out: data flows one way, nothing imports back up.

Module-level imports only (an import inside a function is a deliberate, lazy edge).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "speclab"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.parse(path.read_text()).body:  # top level only
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                deps |= {t} if t in modules and t != name else set()
                parts = t.split(".")  # importing a.b.c runs a/b/__init__ first: an edge to each parent package,
                deps |= {p for p in (".".join(parts[:i]) for i in range(2, len(parts)))  # except the root and the
                         if p in modules and p != name and not name.startswith(p + ".")}  # importer's own (already running)
        graph[name] = deps
    return graph


def find_cycle(graph):
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state and (cycle := visit(m)):
                return cycle
        state[n] = "done"
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state and (cycle := visit(n)):
            return cycle
    return None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_engine_does_not_import_proposers_or_the_front_end():
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("speclab.engine"):
            up = {d for d in deps if d.startswith(("speclab.proposers", "speclab.llm", "speclab.bench", "speclab.demo"))}
            assert not up, f"{name} imports {sorted(up)}: proposers and front ends depend on the engine, not the reverse"
