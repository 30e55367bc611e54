"""Data: the stdlib training corpus (corpus.py), the committed held-out prompt sets (prompts.py) and
the chat prompt sets for the real model (chat_prompts.py)."""

from speclab.data.chat_prompts import SETS as CHAT_SETS
from speclab.data.chat_prompts import chat_prompts_version, load_chat_prompts
from speclab.data.prompts import KINDS, load_prompts

__all__ = ["CHAT_SETS", "KINDS", "chat_prompts_version", "load_chat_prompts", "load_prompts"]
