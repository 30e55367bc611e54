"""The README and MEASUREMENTS.md point at files, JSONs and sections: every one of them must exist.

Figures move between the two files as runs are added (the README keeps the latest, MEASUREMENTS.md the
history), and a renamed JSON or heading would otherwise leave a reader following a dead reference.
"""

import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "MEASUREMENTS.md", "CONTRIBUTING.md", "notebooks/vllm_crosswalk.md"]
OURS = DOCS[:3]  # the crosswalk also names vLLM's own files (tests/v1/...), so only its links are checked
TOP = ("speclab/", "tests/", "notebooks/", "scripts/", "kernels/", "exercises/", "solutions/", "figures/")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")   # [text](target)
CODE = re.compile(r"`([^`\s]+)`")                # `a/path` or `a_file.json`


@functools.cache
def tracked() -> frozenset[str] | None:
    """Files git tracks (and the folders above them), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = set(out.split("\n")) - {""}
    return frozenset(files | {str(Path(f).parents[i]) for f in files for i in range(len(Path(f).parents) - 1)})


def in_repository(path: Path) -> bool:
    """True if `path` is committed, or is a git-ignored output a documented command writes (`figures/demo.png`).

    A file that exists only in this working tree would pass here and fail on CI's clean clone, so existence
    on disk is the test only outside a git checkout.
    """
    files = tracked()
    if files is None:
        return path.exists()
    try:
        rel = str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.exists()
    if rel in files or rel == ".":
        return True
    return subprocess.run(["git", "check-ignore", "-q", rel], cwd=ROOT).returncode == 0


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}


def test_slug_follows_githubs_rule():
    assert slug("Real vLLM: the same script past a laptop") == "real-vllm-the-same-script-past-a-laptop"
    assert slug("`bench verify-cost`, the kernels and huge pages") == "bench-verify-cost-the-kernels-and-huge-pages"


def broken_links(path: Path) -> list[str]:
    """Relative links in `path` whose file or heading does not exist."""
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not in_repository(dest):
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


def missing_names(path: Path) -> list[str]:
    """Repository paths (`speclab/...`, `tests/...`, ...) and speclab/data JSONs named in `path` that do not exist."""
    missing = []
    for name in CODE.findall(path.read_text()):
        name = name.rstrip(".,;:)")
        if name.startswith(TOP) and not any(c in name for c in "*{}<>$"):
            if not in_repository(ROOT / name.split("::")[0]):
                missing.append(name)
        elif re.fullmatch(r"[\w.-]+_smollm2[\w.-]*\.json", name) and not in_repository(ROOT / "speclab" / "data" / name):
            missing.append(name)   # a JSON named alone lives in speclab/data/
    return sorted(set(missing))


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_reaches_a_file_and_a_heading(doc):
    assert not broken_links(ROOT / doc), f"{doc}: " + "; ".join(broken_links(ROOT / doc))


@pytest.mark.parametrize("doc", OURS)
def test_every_path_and_json_named_exists(doc):
    assert not missing_names(ROOT / doc), f"{doc} names files that are not in the repository"


def test_the_checks_find_a_dead_link_a_missing_path_and_a_missing_json(tmp_path):
    """Negative control: a document with one of each dead reference fails both checks."""
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n[ok](#title), [gone](#nowhere), [no file](nofile.md), `speclab/nothing_here.py`, "
                   "`heads_smollm2_nonexistent.json`, `speclab/models/llama.py`\n")
    assert broken_links(doc) == ["#nowhere (no heading #nowhere in doc.md)", "nofile.md (no such file)"]
    assert missing_names(doc) == ["heads_smollm2_nonexistent.json", "speclab/nothing_here.py"]


def test_a_file_only_on_this_disk_does_not_count(tmp_path):
    """What CI's clean clone lacks must fail here too: an untracked file is missing, an ignored output is not."""
    if tracked() is None:
        pytest.skip("not a git checkout: existence on disk is all there is to check")
    probe = ROOT / "scripts" / f"_untracked_probe_{tmp_path.name}.py"
    probe.write_text("")
    try:
        doc = tmp_path / "doc.md"
        doc.write_text(f"`scripts/{probe.name}` and `figures/demo.png`\n")
        assert missing_names(doc) == [f"scripts/{probe.name}"]
    finally:
        probe.unlink()
