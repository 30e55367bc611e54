"""Data: the stdlib training corpus (corpus.py) and the committed held-out prompt sets (prompts.py)."""

from speclab.data.prompts import KINDS, load_prompts

__all__ = ["KINDS", "load_prompts"]
