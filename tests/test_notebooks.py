"""Lessons are committed clean and run top to bottom (on the CPU, under Triton's interpreter)."""

import json
import os
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_lessons_exist():
    names = {nb.name for nb in NOTEBOOKS}
    assert {"01_rejection_sampling.ipynb", "02_speculative_loop.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_clean(path):
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, \
                f"{path.name} cell {i} has outputs: strip them before committing"
        assert not {"collapsed", "scrolled", "ExecuteTime", "execution"} & set(cell.get("metadata", {})), \
            f"{path.name} cell {i} carries editor metadata"
        assert "pip install" not in "".join(cell["source"]), f"{path.name} cell {i}: no installs inside lessons"
    assert nb["cells"][0]["cell_type"] == "markdown" and "".join(nb["cells"][0]["source"]).startswith("# ")
    assert "pytest" in "".join(nb["cells"][-1]["source"]), f"{path.name} must end with its exercise command"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_shows_a_committed_figure_from_markdown(path):
    """A stripped notebook shows no plot on a code host: each lesson shows its key figure from a committed,
    small PNG (scripts/make_figures.py), with a caption that says what to see and where it was made."""
    nb = json.loads(path.read_text())
    refs = [(i, m) for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "markdown"
            for m in re.findall(r"!\[[^\]]+\]\((figures/[^)]+\.png)\)", "".join(cell["source"]))]
    assert refs, f"{path.name} shows no figure from notebooks/figures/ in a markdown cell (run `make figures`)"
    for i, ref in refs:
        png = path.parent / ref
        assert png.name.startswith(path.name[:3]), f"{path.name} shows {ref}: a lesson's figures are named NN_*.png"
        assert png.exists(), f"{path.name} cell {i} shows {ref}, which is not committed (run `make figures`)"
        assert png.stat().st_size < 200_000, f"{ref} is {png.stat().st_size // 1024} KiB: keep committed figures small"
        caption = " ".join("".join(nb["cells"][i]["source"]).split())
        assert "What you should see" in caption and "machine and date" in caption, \
            f"{path.name} cell {i}: the caption must say what you should see and where the machine and date are"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, capsys):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    os.environ.setdefault("TRITON_INTERPRET", "1")  # inherited by the kernel when there is no GPU
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    with capsys.disabled():
        print(f"\n  {path.name}: {time.perf_counter() - start:.1f}s", end="")
