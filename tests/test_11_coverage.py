"""Lesson 11 answers every check-yourself question of lessons 00-10 at two lengths, with the wrong line.

A lesson's check-yourself questions are the numbered items of its "Check yourself" section (a heading, or
a bold "**Check yourself.**" with inline "(1) ... (2) ..." items, as lesson 08 has), or of a section that
sends its numbered questions to `solutions/answers/` (lesson 00's five exercises). Lesson 11 restates each as
"**NN.i** <the question>" followed by three items: "*30 s.*", "*3 min.*" and "*Often said wrong:*". The
checker below fails when a lesson gains a question without such an entry, when an entry lacks one of the
three parts, or when an entry answers a question no lesson asks (any more). Negative controls run it on
synthetic notebooks. Fast: json and regular expressions, no kernel.
"""

import copy
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSON_11 = ROOT / "notebooks" / "11_interview_review.ipynb"
LESSONS = sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if p.name[:2] <= "10")

HEADING = re.compile(r"^#{1,6}\s")
CHECK_HEADING = re.compile(r"^#{1,6}\s*check yourself\b", re.I)
CHECK_BOLD = re.compile(r"\*\*check yourself\.?\*\*", re.I)
ITEM = re.compile(r"^\s{0,3}(\d+)\.\s+(.*)")
INLINE = re.compile(r"\((\d+)\)\s")
ENTRY = re.compile(r"^\*\*(\d\d)\.(\d+)\*\*\s+(.*)")
PARTS = {"30 s": re.compile(r"^\s*-\s*\*30 s\.\*\s*(.*)"),
         "3 min": re.compile(r"^\s*-\s*\*3 min\.\*\s*(.*)"),
         "wrong": re.compile(r"^\s*-\s*\*Often said wrong:\*\s*(.*)")}


def normalise(text: str) -> str:
    """Compare questions as text: markdown emphasis and code marks dropped, whitespace collapsed."""
    return " ".join(re.sub(r"[*`]", "", text).split())


def _sections(markdown: str):
    """Split a markdown cell at its headings: (heading line or '', body lines)."""
    sections, head, body = [], "", []
    for line in markdown.splitlines():
        if HEADING.match(line):
            sections.append((head, body))
            head, body = line, []
        else:
            body.append(line)
    sections.append((head, body))
    return sections


def _numbered(lines):
    """Numbered list items with their continuation lines, until a line that is neither."""
    items, current = [], None
    for line in lines:
        m = ITEM.match(line)
        if m:
            current = [int(m.group(1)), m.group(2)]
            items.append(current)
        elif current is not None and line.strip() and line.startswith((" ", "\t")):
            current[1] += " " + line.strip()
        elif current is not None and line.strip():
            current = None  # a paragraph after the list ends it
    return [(n, normalise(t)) for n, t in items]


def _inline(text):
    """'(1) first? (2) second?' -> [(1, 'first?'), (2, 'second?')]."""
    parts = INLINE.split(text)
    return [(int(parts[i]), normalise(parts[i + 1])) for i in range(1, len(parts) - 1, 2)]


def lesson_questions(nb: dict) -> list[tuple[int, str]]:
    """A lesson notebook's check-yourself questions, in order, as (number, normalised text)."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        for head, body in _sections(text):
            joined = "\n".join(body)
            if CHECK_HEADING.match(head):
                found += _numbered(body)
            elif CHECK_BOLD.search(joined):
                after = CHECK_BOLD.split(joined, maxsplit=1)[1]
                paragraph = re.split(r"\n\s*\n", after.strip(), maxsplit=1)[0]
                found += _inline(paragraph) or _numbered(paragraph.splitlines())
            elif "solutions/answers/" in joined:
                found += _numbered(body)
    numbers = [n for n, _ in found]
    assert numbers == list(range(1, len(found) + 1)), f"check-yourself questions numbered {numbers}: expected 1..n"
    return found


def lesson_11_entries(nb: dict) -> dict[tuple[str, int], dict]:
    """Lesson 11's answers: {(lesson, i): {"question": ..., "30 s": ..., "3 min": ..., "wrong": ...}}."""
    entries, current, part = {}, None, None
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for line in "".join(cell["source"]).splitlines() + [""]:
            m = ENTRY.match(line)
            if m:
                key = (m.group(1), int(m.group(2)))
                assert key not in entries, f"lesson 11 answers {key[0]}.{key[1]} twice"
                current, part = {"question": m.group(3)}, "question"
                entries[key] = current
                continue
            if current is None:
                continue
            if HEADING.match(line):
                current = part = None
                continue
            hit = next(((name, p.match(line)) for name, p in PARTS.items() if p.match(line)), None)
            if hit:
                part = hit[0]
                current[part] = hit[1].group(1)
            elif line.strip() and part is not None:
                current[part] += " " + line.strip()
            elif not line.strip() and part != "question":
                part = None
        current = part = None  # an entry does not run across cells
    return {k: {name: normalise(v) for name, v in e.items()} for k, e in entries.items()}


def coverage_problems(lessons: dict[str, dict], review: dict) -> list[str]:
    """Everything wrong with `review`'s answers to the lessons' questions (an empty list when all is well)."""
    entries = lesson_11_entries(review)
    problems, asked = [], set()
    for lesson, nb in lessons.items():
        for i, question in lesson_questions(nb):
            asked.add((lesson, i))
            entry = entries.get((lesson, i))
            where = f"lesson {lesson}, question {i} ({question[:60]!r})"
            if entry is None:
                problems.append(f"{where}: lesson 11 has no '**{lesson}.{i}**' entry")
                continue
            if entry["question"] != question:
                problems.append(f"{where}: lesson 11 restates it as {entry['question'][:60]!r}")
            for part, least in (("30 s", 60), ("3 min", 200), ("wrong", 15)):
                if len(entry.get(part, "")) < least:
                    problems.append(f"{where}: the '{part}' answer is missing or under {least} characters")
            if len(entry.get("3 min", "")) <= len(entry.get("30 s", "")):
                problems.append(f"{where}: the 3-minute answer is not longer than the 30-second one")
    for lesson, i in sorted(set(entries) - asked):
        problems.append(f"lesson 11 answers {lesson}.{i}, which lesson {lesson} does not ask")
    return problems


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def real_lessons() -> dict[str, dict]:
    return {p.name[:2]: load(p) for p in LESSONS}


# --- the real course ------------------------------------------------------------------------------------


def test_lessons_00_to_10_are_all_read():
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(11)]


def test_every_lesson_00_to_09_has_its_questions_found():
    """Guards the parser: a change of format that hid a lesson's questions would make coverage vacuous."""
    counts = {lesson: len(lesson_questions(nb)) for lesson, nb in real_lessons().items()}
    assert all(counts[f"{i:02d}"] >= 4 for i in range(10)), counts
    assert sum(counts.values()) >= 49, counts


def test_lesson_11_answers_every_check_yourself_question():
    problems = coverage_problems(real_lessons(), load(LESSON_11))
    assert not problems, "lesson 11's section 8 is out of date:\n" + "\n".join(problems)


# --- the parser on each format the lessons use ----------------------------------------------------------


def md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(keepends=True)}


def notebook(*texts: str) -> dict:
    return {"cells": [md(t) for t in texts], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def answer(lesson: str, i: int, question: str, parts=("30 s", "3 min", "wrong")) -> str:
    lines = [f"**{lesson}.{i}** {question}"]
    if "30 s" in parts:
        lines.append("- *30 s.* " + "A short answer that says the essential thing in a sentence or two, no more. ")
    if "3 min" in parts:
        lines.append("- *3 min.* " + "A long answer with the derivation, the numbers and where it lives in vLLM. " * 4)
    if "wrong" in parts:
        lines.append("- *Often said wrong:* \"the usual wrong answer\".")
    return "\n".join(lines)


LESSON_HEADING = notebook("# 42 · a lesson", "## Check yourself\n\n1. Why is *p* one?\n2. What is `k`,\n   "
                          "and why?\n\nAnswers: `solutions/answers/42_x.md` (try first).")
LESSON_BOLD = notebook("## 8. Where\n\n| a | b |\n\n**Check yourself.** (1) First `q`? (2) Second,\nwrapped?\n\n"
                       "## Exercises\n\n1. not a check-yourself question")
LESSON_ANSWERS = notebook("## Exercises\n\n1. Measure it.\n2. Explain it.\n\nAnswers to these: "
                          "`solutions/answers/42_x.md`.")
LESSON_NONE = notebook("## Exercises\n\n1. A coding exercise with no written answer.\n\n```bash\npytest\n```")


def test_the_parser_reads_each_format():
    assert lesson_questions(LESSON_HEADING) == [(1, "Why is p one?"), (2, "What is k, and why?")]
    assert lesson_questions(LESSON_BOLD) == [(1, "First q?"), (2, "Second, wrapped?")]
    assert lesson_questions(LESSON_ANSWERS) == [(1, "Measure it."), (2, "Explain it.")]
    assert lesson_questions(LESSON_NONE) == []


def test_a_complete_synthetic_review_passes():
    review = notebook("## 8. All\n\n" + answer("42", 1, "Why is *p* one?") + "\n\n"
                      + answer("42", 2, "What is `k`, and why?"))
    assert coverage_problems({"42": LESSON_HEADING}, review) == []


# --- negative controls: each way of falling behind is caught --------------------------------------------


def test_a_question_added_to_a_lesson_without_an_answer_fails():
    review = notebook(answer("42", 1, "Why is *p* one?") + "\n\n" + answer("42", 2, "What is `k`, and why?"))
    grown = copy.deepcopy(LESSON_HEADING)
    grown["cells"][1]["source"].insert(-2, "3. A new question nobody answered?\n")
    problems = coverage_problems({"42": grown}, review)
    assert problems == ["lesson 42, question 3 ('A new question nobody answered?'): "
                        "lesson 11 has no '**42.3**' entry"]


def test_a_question_added_to_a_real_lesson_fails():
    lessons = real_lessons()
    cell = next(c for c in lessons["03"]["cells"] if "## Check yourself" in "".join(c["source"]))
    at = max(i for i, line in enumerate(cell["source"]) if ITEM.match(line)) + 1
    cell["source"].insert(at, "6. Why does a longer prompt_lookup_max not always draft more?\n")
    problems = coverage_problems(lessons, load(LESSON_11))
    assert len(problems) == 1 and "lesson 03, question 6" in problems[0], problems


def test_an_entry_missing_a_length_or_the_wrong_line_fails():
    for missing in ("30 s", "3 min", "wrong"):
        kept = tuple(p for p in ("30 s", "3 min", "wrong") if p != missing)
        review = notebook(answer("42", 1, "Why is *p* one?", kept) + "\n\n" + answer("42", 2, "What is `k`, and why?"))
        problems = coverage_problems({"42": LESSON_HEADING}, review)
        assert any(f"'{missing}' answer is missing" in p for p in problems), (missing, problems)


def test_a_reworded_question_or_a_stale_answer_fails():
    review = notebook(answer("42", 1, "Why is p two?") + "\n\n" + answer("42", 2, "What is `k`, and why?") + "\n\n"
                      + answer("42", 3, "A question the lesson dropped?"))
    problems = coverage_problems({"42": LESSON_HEADING}, review)
    assert any("restates it as 'Why is p two?'" in p for p in problems), problems
    assert any("answers 42.3, which lesson 42 does not ask" in p for p in problems), problems


def test_a_short_answer_longer_than_the_long_one_fails():
    entry = ("**42.1** Why is *p* one?\n- *30 s.* " + "short but wordy " * 30 + "\n- *3 min.* "
             + "long " * 45 + "\n- *Often said wrong:* \"it is two, as everyone says\".")
    review = notebook(entry + "\n\n" + answer("42", 2, "What is `k`, and why?"))
    problems = coverage_problems({"42": LESSON_HEADING}, review)
    assert problems == ["lesson 42, question 1 ('Why is p one?'): the 3-minute answer is not longer than the "
                        "30-second one"]


@pytest.mark.parametrize("numbers", [(1, 3), (2, 1)])
def test_misnumbered_questions_are_refused(numbers):
    nb = notebook("## Check yourself\n\n" + "\n".join(f"{n}. Question {n}?" for n in numbers))
    with pytest.raises(AssertionError, match="expected 1..n"):
        lesson_questions(nb)
