"""The engine's structure, as vLLM v1 lays it out: data flows one way, nothing imports back up.

Every import counts, in-function ones included (a lazy import is still an edge that can close a
circle). The graph, the module count and the function lengths come from scripts/house_report.py,
which prints the same figures for people.
"""

import importlib.util
from pathlib import Path

REPORT = Path(__file__).resolve().parents[1] / "scripts" / "house_report.py"
_spec = importlib.util.spec_from_file_location("house_report", REPORT)
house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house)

MAX_FUNCTION_LINES = 80
MAX_VERIFY_MODULES = 10


def test_no_import_circles_in_function_imports_included():
    found = house.cycles(house.import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_a_circle():
    """Negative control: a graph with a circle must be reported, or the test above proves nothing."""
    assert house.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = house.import_graph()
    assert "speclab.llm" in graph["speclab.bench.cli"]  # module-level edges are seen
    assert "speclab.kernels.rejection_sample" in graph["speclab.verify.backend"]  # and in-function ones


def test_import_speclab_verify_is_light():
    loaded = house.loaded_by("speclab.verify")
    assert len(loaded) <= MAX_VERIFY_MODULES, f"`import speclab.verify` loads {len(loaded)} modules: {loaded}"
    assert "speclab.llm" not in loaded and "speclab.engine" not in loaded


def test_no_function_is_over_80_lines():
    long = [(n, where) for n, where in house.function_lengths() if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into steps): {long}"


def test_engine_does_not_import_proposers_or_the_front_end():
    graph = house.import_graph()
    for name, deps in graph.items():
        if name.startswith("speclab.engine"):
            up = {d for d in deps if d.startswith(("speclab.proposers", "speclab.llm", "speclab.bench", "speclab.demo",
                                                   "speclab.spec_config"))}
            assert not up, f"{name} imports {sorted(up)}: proposers and front ends depend on the engine, not the reverse"


def test_verification_rules_do_not_import_the_engine():
    graph = house.import_graph()
    for name, deps in graph.items():
        if name.startswith("speclab.verify") and name != "speclab.verify.backend":
            assert not {d for d in deps if d.startswith(("speclab.engine", "speclab.kernels"))}, name
