"""Training conversations for distilling drafts of the real model, disjoint from the held-out sets.

The held-out chat sets (chat_prompts.py: edit, codegen, qa, chat) are built from the *held-out*
stdlib modules of the embedded corpus (corpus.py). These training conversations are built the same
ways (the same builders, the same system prompt) from the *train-split* modules, plus open chat
questions written here that are not in the held-out chat set. So a draft distilled on the target's
answers to these prompts has never seen a held-out passage, function or question.

`train_prompts.json` is built once by `python -m speclab.data.train_prompts` and committed (the
stdlib differs between Python versions); bump VERSION whenever it changes. Records are
`{"id", "set", "task", "messages"}`.
"""

from __future__ import annotations

import json
from pathlib import Path

from speclab.data.chat_prompts import SYSTEM, _codegen_records, _edit_records, _qa_records
from speclab.data.prompts import _functions, _pick

VERSION = 1
TRAIN_PROMPTS_PATH = Path(__file__).parent / "train_prompts.json"
COUNTS = {"edit": 160, "codegen": 80, "qa": 80}        # plus every question of CHAT_TRAIN

# Open questions written here for training (none is in chat_prompts.CHAT); asked without a system
# prompt, like the held-out chat set, so the model's own default system prompt applies.
CHAT_TRAIN = (
    "What is a Python generator and when would I use one?",
    "Explain the difference between a process and a thread.",
    "How do I reverse a string in Python?",
    "What is the capital of Australia, and why is it not Sydney?",
    "Give me a simple recipe for pancakes.",
    "Write a short poem about the ocean at night.",
    "What are three good habits for staying healthy?",
    "Explain what an API is in one paragraph.",
    "How do vaccines train the immune system?",
    "What is the difference between weather and climate?",
    "Suggest five names for a pet turtle.",
    "How does compound interest work? Give an example.",
    "What is Big-O notation?",
    "Explain how a binary search works.",
    "Write a limerick about a cat who loves boxes.",
    "How can I stay focused while studying?",
    "What is photosynthesis?",
    "Describe the water cycle in a few sentences.",
    "What is the difference between git merge and git rebase?",
    "Why do we have seasons on Earth?",
    "Give me an idea for a birthday party for a seven-year-old.",
    "What is a linked list and how is it different from an array?",
    "How do I make a good first impression at a job interview?",
    "Explain what machine learning is to my grandmother.",
    "What is the Pythagorean theorem? Show an example.",
    "Write a short thank-you note to a neighbour who watered my plants.",
    "What are the main causes of inflation?",
    "How do I write a for loop in Python that counts down from ten?",
    "What is the difference between HTTP and HTTPS?",
    "Tell me a fun fact about octopuses.",
    "How does a refrigerator keep food cold?",
    "What is a good way to learn a new language as an adult?",
    "Explain the rules of tic-tac-toe.",
    "What is an operating system?",
    "Write a two-sentence horror story.",
    "What is the difference between a virus and a bacterium?",
    "How do I sort a dictionary by its values in Python?",
    "Give three arguments for and against homework.",
    "What is the speed of light and why does it matter?",
    "Explain what a database index does.",
    "How do bees make honey?",
    "Plan a simple three-day itinerary for a trip to Rome.",
    "What is the difference between `==` and `is` in Python?",
    "Why is sleep important?",
    "Explain unit testing and why developers write tests.",
    "Describe a sunset to someone who has never seen one.",
    "What are prime numbers? List the first ten.",
    "How do I handle exceptions in Python?",
    "What makes a good team leader?",
    "Explain how the internet sends a message from one computer to another.",
    "What is a closure in programming?",
    "Write a short motivational message for someone starting a new job.",
    "How do airplanes stay in the air?",
    "What is the difference between RAM and storage?",
    "Suggest a weekly exercise plan for a beginner.",
    "What is a regular expression? Give a small example.",
    "Why do leaves change colour in autumn?",
    "How do I read a file line by line in Python?",
    "Explain the idea of supply and demand.",
    "What is recursion's base case and why is it needed?",
    "Write a friendly reminder email about an upcoming meeting.",
    "What are the planets of the solar system, in order?",
    "How can I reduce my screen time?",
    "What is object-oriented programming?",
)


def build_train_prompts(files, counts: dict | None = None, max_lines: int = 30, max_chars: int = 1400) -> dict:
    """Build the training conversations from the train-split `files` (corpus.SourceFile)."""
    from speclab.data.chat_prompts import CHAT

    counts = dict(COUNTS, **(counts or {}))
    if set(CHAT_TRAIN) & set(CHAT):
        raise ValueError("a training chat question is also in the held-out chat set")
    train = [f for f in files if f.split == "train"]
    funcs = [(node, fid, src) for f in train for node, fid, src in _functions(f.name, f.text)
             if 5 <= len(src) <= max_lines and len("".join(src)) <= max_chars and max(map(len, src)) <= 100]
    edit_all = _edit_records(funcs)
    edit = []
    for task in ("rename", "type_hints", "docstring", "fix_bug"):
        edit += _pick([r for r in edit_all if r["task"] == task], counts["edit"] // 4, salt="train-edit-" + task,
                      per_file=2)
    sets = {
        "edit": sorted(edit, key=lambda r: (r["task"], r["id"])),
        "codegen": _pick(_codegen_records(funcs), counts["codegen"], salt="train-codegen", per_file=2),
        "qa": _pick(_qa_records(train), counts["qa"], salt="train-qa", per_file=2),
        "chat": [{"id": f"train-chat:{i}", "task": "open", "messages": [{"role": "user", "content": q}]}
                 for i, q in enumerate(CHAT_TRAIN)],
    }
    records = [{"id": f"{name}/{r['task']}/{r['id']}", "set": name, "task": r["task"], "messages": r["messages"]}
               for name, rs in sets.items() for r in rs]
    return {"version": VERSION,
            "about": {"source": "train-split stdlib modules (speclab/data/corpus.py split) and questions written "
                                "here; see speclab/data/train_prompts.py", "system": SYSTEM},
            "records": records}


def load_train_prompts(path: str | Path | None = None) -> list[dict]:
    """The committed training conversations: `{"id", "set", "task", "messages"}` records."""
    return json.loads(Path(path or TRAIN_PROMPTS_PATH).read_text())["records"]


def train_prompts_version(path: str | Path | None = None) -> int:
    return json.loads(Path(path or TRAIN_PROMPTS_PATH).read_text())["version"]


if __name__ == "__main__":
    import platform
    from collections import Counter

    from speclab.data.corpus import collect

    built = build_train_prompts(collect())
    built["about"]["python_version"] = platform.python_version()
    TRAIN_PROMPTS_PATH.write_text(json.dumps(built, indent=1) + "\n")
    print(f"wrote {TRAIN_PROMPTS_PATH}: {len(built['records'])} conversations, "
          f"{dict(Counter(r['set'] for r in built['records']))}")
