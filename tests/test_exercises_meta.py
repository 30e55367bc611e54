"""Meta-tests of the exercise machinery: stubs and solutions match, and every stub fails its tests."""

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted(p.stem for p in (ROOT / "exercises").glob("ex[0-9][0-9]_*.py"))


def public_functions(module):
    return {name: obj for name, obj in vars(module).items()
            if not name.startswith("_") and callable(obj)
            and getattr(getattr(obj, "fn", obj), "__module__", None) == module.__name__}  # .fn: a @triton.jit kernel


def signature(fn):
    return inspect.signature(getattr(fn, "fn", fn))  # a @triton.jit function keeps its Python function in .fn


def test_there_are_exercises():
    assert {"ex01_rejection_sampling", "ex02_speculative_loop"} <= set(EXERCISES)


@pytest.mark.parametrize("name", EXERCISES)
def test_solution_and_test_file_exist(name):
    assert (ROOT / "solutions" / f"{name}.py").exists(), f"solutions/{name}.py is missing"
    assert (ROOT / "tests" / f"test_{name}.py").exists(), f"tests/test_{name}.py is missing"


@pytest.mark.parametrize("name", EXERCISES)
def test_stub_and_solution_signatures_agree(name):
    stub = public_functions(importlib.import_module(f"exercises.{name}"))
    sol = public_functions(importlib.import_module(f"solutions.{name}"))
    assert stub.keys() == sol.keys(), f"{name}: stub defines {sorted(stub)}, solution {sorted(sol)}"
    for fn in stub:
        assert signature(stub[fn]) == signature(sol[fn]), f"{name}.{fn}: signatures differ"


def function_sources(path: Path) -> dict[str, str]:
    text = path.read_text()
    return {node.name: ast.get_source_segment(text, node) for node in ast.parse(text).body
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}


@pytest.mark.parametrize("name", EXERCISES)
def test_every_stub_raises_a_todo(name):
    """Each stub function is either given scaffolding (identical to the solution) or a TODO to fill in."""
    number = re.match(r"ex(\d\d)", name).group(1)
    stub = function_sources(ROOT / "exercises" / f"{name}.py")
    sol = function_sources(ROOT / "solutions" / f"{name}.py")
    todo = [fn for fn, src in stub.items() if f"TODO(ex{number})" in src]
    assert todo, f"{name} has no TODO(ex{number}) to fill in"
    for fn, src in stub.items():
        assert fn in todo or src == sol.get(fn), \
            f"{name}.{fn} differs from the solution but raises no NotImplementedError('TODO(ex{number}): ...')"


@pytest.fixture(scope="module")
def stub_outcomes(tmp_path_factory):
    """Every exercise's tests graded against the untouched stubs in one pytest subprocess (one start-up
    and torch import instead of one per exercise): {exercise: {"passed": n, "failed": n}}."""
    import xml.etree.ElementTree as ET

    report = tmp_path_factory.mktemp("stubs") / "report.xml"
    env = dict(os.environ, SPECLAB_IMPL="exercises")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
                           f"--junitxml={report}", *(f"tests/test_{name}.py" for name in EXERCISES)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    assert proc.returncode == 1 and report.exists(), f"the exercise tests against the stubs: {summary}"
    outcomes = {name: {"passed": 0, "failed": 0} for name in EXERCISES}
    for case in ET.parse(report).iter("testcase"):
        module = next((part for part in case.get("classname", "").split(".") if part.startswith("test_ex")), "")
        name = module.removeprefix("test_")
        kinds = {child.tag for child in case}
        if name in outcomes and not kinds & {"skipped", "error"}:
            outcomes[name]["failed" if "failure" in kinds else "passed"] += 1
    return outcomes


@pytest.mark.parametrize("name", EXERCISES)
def test_every_stub_fails_its_tests(name, stub_outcomes):
    """Graded against the untouched stubs, not one test may pass (a test that passes a stub grades nothing)."""
    got = stub_outcomes[name]
    assert got["failed"] > 0 and got["passed"] == 0, f"tests/test_{name}.py against the stubs: {got}"
