"""Prompt sets for the lessons and benchmarks, cut from held-out stdlib modules and committed.

Three kinds, each a list of `{"id", "prompt", "reference"}` records in `prompts.json`
(`reference` is the true continuation from the source file):

- `code`:  a function's first lines (signature, docstring, a few body lines); complete it.
- `copy`:  a function, then the start of the same function renamed: the continuation repeats
           material already in the prompt, like a code edit. Prompt lookup (n-gram) shines here.
- `prose`: the start of a long docstring or comment block; mostly English, which the models saw
           less of, so acceptance is lower.

The sets are built once, by `python -m speclab.train`, from modules the models never trained on,
and committed, so that tests and lessons do not depend on the local Python's standard library.
"""

from __future__ import annotations

import ast
import hashlib
import json
import textwrap
from pathlib import Path

KINDS = ("code", "copy", "prose")
PROMPTS_PATH = Path(__file__).parent / "prompts.json"


def load_prompts(kind: str, with_reference: bool = False, path: str | Path | None = None) -> list:
    """The committed prompts of one kind: a list of strings, or of dicts with `reference` too.

    Args:
        kind: "code", "copy" or "prose".
        with_reference: return `{"id", "prompt", "reference"}` dicts instead of prompt strings.
        path: another prompts.json (default: the one shipped in speclab/data).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown prompt kind {kind!r}: choose one of {KINDS}")
    records = json.loads(Path(path or PROMPTS_PATH).read_text())[kind]
    return records if with_reference else [r["prompt"] for r in records]


def _functions(name: str, text: str):
    """(qualified name, dedented source lines) of every function in a file, methods included."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    lines = text.splitlines(keepends=True)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
            src = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno]))
            yield node, f"{name}:{node.name}:{node.lineno}", src.splitlines(keepends=True)


def _body_start(node) -> int:
    """Line offset (within the function) of the first statement after the docstring."""
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        return body[1].lineno - node.lineno
    return body[0].lineno - node.lineno


def _pick(candidates: list[dict], n: int, salt: str, per_file: int = 2) -> list[dict]:
    """n candidates chosen deterministically (hash order), at most `per_file` from one file."""
    candidates = sorted(candidates, key=lambda r: hashlib.sha256((salt + r["id"]).encode()).hexdigest())
    chosen, per = [], {}
    for r in candidates:
        f = r["id"].split(":")[0]
        if per.get(f, 0) < per_file:
            chosen.append(r)
            per[f] = per.get(f, 0) + 1
        if len(chosen) == n:
            break
    return sorted(chosen, key=lambda r: r["id"])


def build_prompts(files, count_tokens, n: int = 32, max_prompt_tokens: int = 320, max_ref_tokens: int = 160) -> dict:
    """Build the three sets from held-out `files` (corpus.SourceFile); `count_tokens(str) -> int`."""
    code, copy, prose = [], [], []
    for f in files:
        if f.split != "heldout":
            continue
        for node, fid, src in _functions(f.name, f.text):
            if not 6 <= len(src) <= 40 or any(len(line) > 120 for line in src):
                continue
            k = _body_start(node)
            cut = min(k + 3, len(src) - 2)
            rec = {"id": fid, "prompt": "".join(src[:cut]), "reference": "".join(src[cut:])}
            code.append(rec)
            new_name = node.name + "_v2" if not node.name.endswith("__") else node.name[:-2] + "_v2__"
            renamed = [line.replace(node.name, new_name, 1) if i == 0 else line for i, line in enumerate(src)]
            # the first line of the renamed copy, then the model should repeat the rest
            copy.append({"id": fid, "prompt": "".join(src) + "\n\n" + "".join(renamed[:2]),
                         "reference": "".join(renamed[2:])})
            doc = ast.get_docstring(node, clean=False)
            if doc and doc.count("\n") >= 4 and k >= 6:
                prose.append({"id": fid, "prompt": "".join(src[:3]), "reference": "".join(src[3:k])})
    out = {}
    for kind, cands in (("code", code), ("copy", copy), ("prose", prose)):
        cands = [r for r in cands if count_tokens(r["prompt"]) <= max_prompt_tokens
                 and 8 <= count_tokens(r["reference"]) <= max_ref_tokens]
        out[kind] = _pick(cands, n, salt=kind)
    return out
