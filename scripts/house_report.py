"""The house's shape in numbers: import circles, what `import speclab.verify` loads, the longest functions.

    python scripts/house_report.py          # prints the report
tests/test_architecture.py asserts on the same functions (no circle, a light verify, no function over 80 lines).
Every import counts here, in-function ones included: a lazy import is still an edge of the graph.
"""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"speclab": REPO / "speclab", "speclab.kernels": REPO / "kernels"}


def modules() -> dict[str, Path]:
    """Every module of the package (kernels/ as speclab.kernels) -> its file."""
    found = {}
    for prefix, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((prefix, *parts))] = path
    return found


def _targets(node: ast.AST, importer: str, is_package: bool) -> list[str]:
    """The modules an import statement names (relative imports resolved against `importer`)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph(include_lazy: bool = True) -> dict[str, set[str]]:
    """module -> the speclab modules it imports (and their parent packages, which run first)."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        nodes = ast.walk(tree) if include_lazy else tree.body
        deps = set()
        for node in nodes:
            for t in _targets(node, name, path.name == "__init__.py"):
                parts = t.split(".")
                for i in range(2, len(parts) + 1):  # a.b.c runs a.b first (the root and own parents excepted)
                    p = ".".join(parts[:i])
                    if p in mods and p != name and not name.startswith(p + "."):
                        deps.add(p)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def loaded_by(module: str) -> list[str]:
    """The speclab modules a fresh interpreter has loaded after `import module`."""
    code = f"import sys, {module}; print('\\n'.join(sorted(m for m in sys.modules if m.startswith('speclab'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return out.stdout.split()


def function_lengths() -> list[tuple[int, str]]:
    """(lines, "module:qualname") for every function and method, longest first."""
    rows = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    owner = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
                    rows.append((child.end_lineno - child.lineno + 1, f"{name}:{owner}{child.name}"))
    return sorted(rows, reverse=True)


def main() -> None:
    graph = import_graph()
    found = cycles(graph)
    print(f"import circles (in-function imports included): {len(found)}")
    for comp in found:
        print("   ", " <-> ".join(comp))
    loaded = loaded_by("speclab.verify")
    print(f"`import speclab.verify` loads {len(loaded)} speclab modules: {', '.join(loaded)}")
    print("the ten longest functions:")
    for n, where in function_lengths()[:10]:
        print(f"   {n:4d}  {where}")


if __name__ == "__main__":
    main()
