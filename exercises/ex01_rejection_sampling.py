"""Exercise 01: speculative sampling for N sequences at once, without a Python loop.

Lesson 01 verifies one sequence with a loop over its drafts. Here N sequences that each drafted k
tokens are verified together, with tensor operations over the batch (a loop over the k positions is
allowed; a loop over the N rows is what to avoid). Fill in the four functions, then grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex01_rejection_sampling.py
Lesson: notebooks/01_rejection_sampling.ipynb. Notation: p = target, q = draft.
"""

import torch


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """Elementwise min(1, p/q), any shape; 0 where q <= 0 (a token the draft could not propose)."""
    raise NotImplementedError("TODO(ex01): 2-3 lines: torch.where on q > 0, without dividing by 0")


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)) for every row of (..., V) tensors; a row with nothing left over
    (p <= q everywhere, i.e. p == q) falls back to p."""
    raise NotImplementedError("TODO(ex01): 3 lines: clamp, sum over the last dim, normalise row by row")


def verify_batch(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, uniforms: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Verify N sequences' k drafts in one go.

    Args:
        draft_tokens: (N, k) int64, row n drawn from q[n].
        p: (N, k + 1, V) target rows; q: (N, k, V) draft rows; uniforms: (N, k) in (0, 1).
    Returns:
        (N, k + 1) int64: accepted drafts, then the recovered or bonus token, then -1.
    """
    raise NotImplementedError("TODO(ex01): ~10 lines: gather p(x) and q(x), count each row's leading "
                              "accepts n (cumprod), then one multinomial over the rows you end on")


def verify_greedy_batch(draft_tokens: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Greedy verification of N sequences: (N, k) drafts, (N, k + 1, V) target rows -> (N, k + 1)."""
    raise NotImplementedError("TODO(ex01): 3-4 lines: the same leading-run count, with x == argmax p")
