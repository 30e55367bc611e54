"""Exercise 02: the speedup theory, and one round of the speculative loop.

Fill in the four functions, then grade yourself:
    pytest --impl=exercises tests/test_ex02_speculative_loop.py
Lesson: notebooks/02_speculative_loop.ipynb. You may use speclab.verify.verify_step.
"""

import torch

from speclab.verify import verify_step  # noqa: F401  (yours to use)


def expected_tokens(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 when alpha == 1."""
    raise NotImplementedError("TODO(ex02): 3 lines; mind alpha == 1")


def speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime improvement: expected_tokens / (gamma c + 1)."""
    raise NotImplementedError("TODO(ex02): 1 line")


def best_gamma(alpha: float, c: float, max_gamma: int = 32) -> int:
    """The gamma in 0..max_gamma with the largest speedup (first one on ties)."""
    raise NotImplementedError("TODO(ex02): 1-3 lines: try every gamma")


def speculative_step(target, draft, tokens: list[int], gamma: int,
                     generator: torch.Generator | None = None) -> list[int]:
    """Draft gamma tokens, score them with the target, verify; return the tokens to append.

    Args:
        target, draft: callables tokens -> (V,) next-token probabilities.
    """
    raise NotImplementedError("TODO(ex02): ~10 lines: sample gamma drafts from q, stack the target's "
                              "gamma + 1 rows, call verify_step")
