"""The training corpus: Python source from the running interpreter's standard library.

The embedded model pair (see DESIGN.md, "The embedded model pair") is trained on the stdlib of
whichever Python runs the training script. Files are split into train and held-out **by top-level
module** (all of `email/` goes one way), deterministically from a hash of the module name, so that
held-out code is code the models never saw, not just unseen lines of a seen file.

The stdlib differs between Python versions, so the manifest records the version and a corpus hash;
the lessons and tests never read the local stdlib: they use the committed prompt sets (prompts.py).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Top-level modules/packages left out: test suites, GUI code, data tables, vendored tools.
EXCLUDED_TOP = {
    "test", "tests", "idlelib", "tkinter", "turtledemo", "turtle", "lib2to3", "ensurepip",
    "site-packages", "dist-packages", "pydoc_data", "encodings", "__phello__", "lib-dynload",
    "venv", "this", "antigravity",
}
EXCLUDED_PARTS = {"test", "tests", "__pycache__", "site-packages", "dist-packages", "idle_test"}
MAX_FILE_BYTES = 300_000  # a few generated tables are larger; they teach nothing about code


@dataclass(frozen=True)
class SourceFile:
    """One stdlib file: its path relative to the stdlib root, its split and its text."""
    name: str       # e.g. "email/parser.py"
    module: str     # top-level module, e.g. "email"
    split: str      # "train" or "heldout"
    sha256: str
    text: str


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(module: str, heldout_percent: int = 10) -> str:
    """Deterministic split of a top-level module: `heldout` for about `heldout_percent`% of them."""
    h = int(hashlib.sha256(module.encode()).hexdigest()[:8], 16)
    return "heldout" if h % 100 < heldout_percent else "train"


def _included(rel: Path) -> bool:
    parts = rel.parts
    top = parts[0].removesuffix(".py")
    if top in EXCLUDED_TOP or top.startswith(("config-", "_sysconfigdata")):
        return False
    if any(p in EXCLUDED_PARTS or p.startswith("test_") for p in parts):
        return False
    return rel.suffix == ".py"


def collect(root: Path | None = None, heldout_percent: int = 10, limit: int | None = None) -> list[SourceFile]:
    """All included `.py` files under `root` (default: the stdlib), sorted by name.

    Args:
        root: directory to scan; defaults to `stdlib_root()`.
        heldout_percent: share of top-level modules held out.
        limit: keep only the first `limit` files per split (tiny corpora for tests).
    """
    root = Path(root) if root is not None else stdlib_root()
    files, counts = [], {"train": 0, "heldout": 0}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if not _included(rel) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        module = rel.parts[0].removesuffix(".py")
        split = split_of(module, heldout_percent)
        if limit is not None and counts[split] >= limit:
            continue
        counts[split] += 1
        files.append(SourceFile(rel.as_posix(), module, split, hashlib.sha256(raw).hexdigest(), text))
    return files


def corpus_hash(files: list[SourceFile]) -> str:
    """sha256 over the sorted `name sha256 split` lines: equal hashes mean equal corpora."""
    lines = sorted(f"{f.name} {f.sha256} {f.split}" for f in files)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def manifest(files: list[SourceFile]) -> dict:
    """A JSON-able record of the corpus: Python version, hash, and every file with its sha256."""
    return {
        "python_version": sys.version.split()[0],
        "stdlib": str(stdlib_root()),
        "corpus_sha256": corpus_hash(files),
        "num_files": {s: sum(f.split == s for f in files) for s in ("train", "heldout")},
        "num_bytes": {s: sum(len(f.text.encode()) for f in files if f.split == s) for s in ("train", "heldout")},
        "heldout_modules": sorted({f.module for f in files if f.split == "heldout"}),
        "files": [{"name": f.name, "split": f.split, "sha256": f.sha256} for f in files],
    }


def token_windows(tokenizer_dir: str | Path, n_train: int, n_held: int, seq_len: int, seed: int = 0) -> dict:
    """{'train': [...], 'heldout': [...]}: windows of seq_len + 1 token ids of the corpus in a tokenizer's ids,
    at seeded random offsets: the train split's every module, the held-out split's every third (as since
    the first heads). The real model's EAGLE head and its distilled draft read code from here."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    files = collect()
    out = {}
    for split, n in (("train", n_train), ("heldout", n_held)):
        ids = []
        for enc in tok.encode_batch([f.text for f in files if f.split == split][::1 if split == "train" else 3]):
            ids += enc.ids
        ids = np.asarray(ids)
        rng = np.random.default_rng(seed + (split == "heldout"))
        out[split] = [ids[s:s + seq_len + 1].tolist() for s in rng.integers(0, len(ids) - seq_len - 1, n)]
    return out
