"""Chat prompt sets for the real model (SmolLM2-135M-Instruct), versioned and committed.

Four sets, each a list of `{"id", "task", "messages", "reference"}` records in `chat_prompts.json`
(`messages` is a conversation for the chat template; `reference` is a known good answer where one
exists, else null):

- `edit`:    code editing, copy-heavy: rename a function, add type hints, restore a docstring, fix a
             planted bug, in a given stdlib function. Most of the answer repeats the prompt, so
             prompt lookup (n-gram) drafting should pay most here.
- `codegen`: code generation: implement a stdlib function from its signature and docstring.
- `qa`:      grounded QA and summarization over a given stdlib docstring (copy-heavy: quote it).
- `chat`:    open questions written here, with the model's own default system prompt; little to
             copy, so acceptance is lowest.

Built once by `python -m speclab.data.chat_prompts` from the held-out stdlib modules of the
embedded corpus (corpus.py), so a draft distilled on the train split never saw the passages, and
committed, so that tests and lessons do not depend on the local Python. Bump VERSION whenever the
sets change, so that figures measured on one version are not compared with another's.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import textwrap
from pathlib import Path

from speclab.data.prompts import _functions, _pick

SETS = ("edit", "codegen", "qa", "chat")
VERSION = 1
CHAT_PROMPTS_PATH = Path(__file__).parent / "chat_prompts.json"
SYSTEM = "You are a careful Python programmer. Answer concisely."


def load_chat_prompts(kind: str, with_reference: bool = False, path: str | Path | None = None) -> list:
    """The committed conversations of one set: a list of message lists, or the full records.

    Args:
        kind: "edit", "codegen", "qa" or "chat".
        with_reference: return `{"id", "task", "messages", "reference"}` dicts instead.
        path: another chat_prompts.json (default: the one shipped in speclab/data).
    """
    if kind not in SETS:
        raise ValueError(f"unknown chat prompt set {kind!r}: choose one of {SETS}")
    records = json.loads(Path(path or CHAT_PROMPTS_PATH).read_text())[kind]
    return records if with_reference else [r["messages"] for r in records]


def chat_prompts_version(path: str | Path | None = None) -> int:
    """The VERSION the committed file was built with (reported beside every figure measured on it)."""
    return json.loads(Path(path or CHAT_PROMPTS_PATH).read_text())["version"]


def _conversation(user: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _code(src: str) -> str:
    return f"```python\n{src.rstrip()}\n```"


# planted bugs: (pattern, replacement, what a reviewer would call it); the first that applies is used
BUGS = ((r" < ", " <= ", "a comparison"), (r" > ", " >= ", "a comparison"), (r" \+ 1\b", " - 1", "an off-by-one"),
        (r" == ", " != ", "a comparison"), (r"\breturn True\b", "return False", "a return value"),
        (r"\bnot ", "", "a negation"))


def _plant_bug(src: str) -> str | None:
    body = src.split("\n", 1)[1] if "\n" in src else ""
    for pattern, repl, _ in BUGS:
        if re.search(pattern, body):
            return src.split("\n", 1)[0] + "\n" + re.sub(pattern, repl, body, count=1)
    return None


def _strip_docstring(node, src: list[str]) -> str | None:
    """The function without its docstring (None if it has none)."""
    body = node.body
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str) and len(body) > 1):
        return None
    a, b = body[0].lineno - node.lineno, body[0].end_lineno - node.lineno
    return "".join(src[:a] + src[b + 1:])


def _new_name(name: str) -> str | None:
    """camelCase -> snake_case, else a `_v2` suffix; None for dunders (renaming them changes meaning)."""
    if name.startswith("__"):
        return None
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), name)
    return snake if snake != name else name + "_v2"


def _ask(instruction: str, code: str) -> list[dict]:
    return _conversation(f"{instruction} Change nothing else; reply with the whole function.\n\n{_code(code)}")


def _edit_records(funcs) -> list[dict]:
    out = []
    for node, fid, src in funcs:
        text = "".join(src)
        if node.args.args and not any(a.annotation for a in node.args.args) and not node.returns:
            out.append({"id": fid, "task": "type_hints", "reference": None,
                        "messages": _ask("Add type hints to this function.", text)})
        new = _new_name(node.name)
        if new:
            out.append({"id": fid, "task": "rename", "reference": re.sub(rf"\b{node.name}\b", new, text),
                        "messages": _ask(f"Rename `{node.name}` to `{new}` everywhere in this code.", text)})
        bare = _strip_docstring(node, src)
        if bare:
            out.append({"id": fid, "task": "docstring", "reference": text,
                        "messages": _ask("Add a docstring to this function.", bare)})
        buggy = _plant_bug(text)
        if buggy:
            out.append({"id": fid, "task": "fix_bug", "reference": text, "messages": _conversation(
                f"This function has one bug. Fix it, change nothing else, and reply with the whole "
                f"corrected function.\n\n{_code(buggy)}")})
    return out


def _codegen_records(funcs) -> list[dict]:
    out = []
    for node, fid, src in funcs:
        bare = _strip_docstring(node, src)
        doc = ast.get_docstring(node)
        if bare is None or not doc or doc.count("\n") < 1:
            continue
        k = node.body[0].end_lineno - node.lineno + 1             # signature and docstring lines
        out.append({"id": fid, "task": "implement", "reference": "".join(src), "messages": _conversation(
            f"Implement this Python function from the standard library. Reply with the complete "
            f"function.\n\n{_code(''.join(src[:k]))}")})
    return out


QA_TASKS = (
    ("summarize", "Summarize this documentation in two or three sentences."),
    ("quote", "According to this documentation, what does `{name}` do? Answer in one sentence, then quote the "
              "sentence of the documentation that supports your answer."),
    ("list", "List every argument or option this documentation mentions, each with what it means, using "
             "the documentation's own words."),
)


def _qa_records(files) -> list[dict]:
    out = []
    for f in files:
        tree = ast.parse(f.text)
        nodes = [(f"{f.name}:module", f.name.removesuffix(".py").replace("/", "."), ast.get_docstring(tree))]
        nodes += [(f"{f.name}:{n.name}:{n.lineno}", n.name, ast.get_docstring(n)) for n in ast.walk(tree)
                  if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        for fid, name, doc in nodes:
            if not doc or not 400 <= len(doc) <= 1600 or doc.count("\n") < 4:
                continue
            h = int(hashlib.sha256(fid.encode()).hexdigest(), 16)
            task, question = QA_TASKS[h % len(QA_TASKS)]
            out.append({"id": fid, "task": task, "reference": None, "messages": _conversation(
                f"Documentation of `{name}`:\n\n\"\"\"\n{textwrap.dedent(doc).strip()}\n\"\"\"\n\n"
                f"{question.format(name=name)}")})
    return out


CHAT = (
    "What is the difference between a list and a tuple in Python? Give one reason to prefer each.",
    "Explain recursion to a ten-year-old.",
    "Give me three tips for writing readable code.",
    "Why is the sky blue? Keep it short.",
    "Write a haiku about a cup of coffee.",
    "What are the pros and cons of working from home?",
    "How does a hash table find a key quickly?",
    "Suggest a name for a small bakery and explain your choice.",
    "What should I pack for a weekend hiking trip?",
    "Explain what a CPU cache is and why it makes programs faster.",
    "Tell me a short story about a robot who learns to paint.",
    "How can I get better at remembering people's names?",
)


def build_chat_prompts(files, n: int = 12, max_lines: int = 30, max_chars: int = 1400) -> dict:
    """Build the four sets from held-out `files` (corpus.SourceFile)."""
    heldout = [f for f in files if f.split == "heldout"]
    funcs = [(node, fid, src) for f in heldout for node, fid, src in _functions(f.name, f.text)
             if 5 <= len(src) <= max_lines and len("".join(src)) <= max_chars and max(map(len, src)) <= 100]
    edit = []
    for task in ("rename", "type_hints", "docstring", "fix_bug"):     # n // 4 of each task
        edit += _pick([r for r in _edit_records(funcs) if r["task"] == task], n // 4, salt="edit-" + task, per_file=1)
    return {
        "version": VERSION,
        "about": {"source": "held-out stdlib modules (speclab/data/corpus.py split) and questions written here; "
                            "see speclab/data/chat_prompts.py", "system": SYSTEM},
        "edit": sorted(edit, key=lambda r: (r["task"], r["id"])),
        "codegen": _pick(_codegen_records(funcs), n, salt="codegen", per_file=1),
        "qa": _pick(_qa_records(heldout), n, salt="qa", per_file=1),
        "chat": [{"id": f"chat:{i}", "task": "open", "reference": None, "messages": [{"role": "user", "content": q}]}
                 for i, q in enumerate(CHAT)][:n],
    }


if __name__ == "__main__":
    import platform

    from speclab.data.corpus import collect

    sets = build_chat_prompts(collect())
    sets["about"]["python_version"] = platform.python_version()
    CHAT_PROMPTS_PATH.write_text(json.dumps(sets, indent=1) + "\n")
    print(f"wrote {CHAT_PROMPTS_PATH}: " + ", ".join(f"{k} {len(sets[k])}" for k in SETS))
