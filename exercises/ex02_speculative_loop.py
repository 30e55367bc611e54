"""Exercise 02: tokens per step when acceptance varies by position, and a loop step that stops
drafting when the draft is unsure.

Lesson 02 assumes one acceptance rate alpha for every position and drafts exactly gamma tokens.
Here acceptance is given per position (alphas[i] = P(accept position i | 0..i-1 accepted)), and the
step may stop drafting early. Fill in the four functions, then grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex02_speculative_loop.py
Lesson: notebooks/02_speculative_loop.ipynb. You may use speclab.verify.verify_step.
"""

import torch

from speclab.verify import verify_step  # noqa: F401  (yours to use)


def expected_tokens_per_position(alphas: list[float]) -> float:
    """1 + a_1 + a_1 a_2 + ... + a_1...a_gamma: tokens per step with conditional acceptances alphas."""
    raise NotImplementedError("TODO(ex02): 4-5 lines: a running product of the alphas")


def speedup(alphas: list[float], c: float) -> float:
    """Expected walltime improvement of drafting gamma = len(alphas) tokens at cost ratio c."""
    raise NotImplementedError("TODO(ex02): 1 line: tokens per step / cost of a step in target forwards")


def best_gamma(alphas: list[float], c: float) -> int:
    """The gamma in 0..len(alphas) whose prefix alphas[:gamma] gives the largest speedup (smallest on ties)."""
    raise NotImplementedError("TODO(ex02): 1-3 lines: try every prefix")


def speculative_step(target, draft, tokens: list[int], gamma: int, min_draft_prob: float = 0.0,
                     generator: torch.Generator | None = None) -> list[int]:
    """One step: draft up to gamma tokens, stopping before position i when max q_i < min_draft_prob;
    score the drafts with len(drafts) + 1 target rows; verify; return the tokens to append.

    Args:
        target, draft: callables tokens -> (V,) next-token probabilities.
    """
    raise NotImplementedError("TODO(ex02): ~12 lines: the lesson's step, plus an early stop decided "
                              "from q_i *before* drawing x_i, and only as many target rows as needed")
