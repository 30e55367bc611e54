"""What the benchmarks run on: the held-out prompt sets of a target as token ids, and its draft.

The embedded pair is a code model: its sets are raw text (speclab.data.prompts: code, copy,
prose). The real model, SmolLM2-135M-Instruct (Q4_1-dequantized), is a chat model: its sets are
conversations (speclab.data.chat_prompts: edit, codegen, qa, chat) rendered by its chat template.
Both engines get the same token ids, so neither side tokenizes differently.
"""

from pathlib import Path

from speclab.chat import chat_prompt_ids
from speclab.data.chat_prompts import load_chat_prompts
from speclab.data.prompts import load_prompts
from speclab.models.hub import REAL, resolve

REAL_SETS = ("edit", "codegen", "qa", "chat")


def is_real(target) -> bool:
    """Whether `target` names the real chat model (its sets are chat conversations)."""
    return isinstance(target, str) and target in REAL


def prompt_ids(tokenizer, target, kind: str, n: int | None = None) -> list[list[int]]:
    """The first `n` prompts of set `kind` as token ids for `target`'s tokenizer."""
    if is_real(target):
        return [chat_prompt_ids(tokenizer, c) for c in load_chat_prompts(kind)[:n]]
    return [tokenizer.encode(p) for p in load_prompts(kind)[:n]]


def find_draft(name) -> Path | None:
    """The local checkpoint directory of draft `name`, or None when there is none here (the
    benchmarks never download one: a hub id counts as absent)."""
    try:
        where, local = resolve(name, "draft")
    except (FileNotFoundError, ValueError):
        return None
    return Path(where) if local and (Path(where) / "config.json").is_file() else None
