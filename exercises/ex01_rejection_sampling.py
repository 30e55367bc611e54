"""Exercise 01: one verification step of speculative sampling.

Fill in the four functions, then grade yourself:
    pytest --impl=exercises tests/test_ex01_rejection_sampling.py
Lesson: notebooks/01_rejection_sampling.ipynb. Notation: p = target, q = draft.
"""

import torch


def acceptance_probability(p_x: float, q_x: float) -> float:
    """min(1, p(x)/q(x)); a token the draft gives probability 0 is never accepted."""
    raise NotImplementedError("TODO(ex01): 3 lines: guard q_x <= 0, then min(1, p/q)")


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): (V,) -> (V,). Falls back to p when p == q (nothing left over)."""
    raise NotImplementedError("TODO(ex01): 4 lines: clamp(p - q, min=0), normalise, handle a zero sum")


def verify(draft_tokens: list[int], p: torch.Tensor, q: torch.Tensor, uniforms: torch.Tensor,
           generator: torch.Generator | None = None) -> list[int]:
    """Verify k drafts; return the accepted ones plus one recovered or bonus token.

    Args:
        draft_tokens: k ids drawn from q.
        p: (k + 1, V) target rows; q: (k, V) draft rows; uniforms: (k,) in (0, 1).
    """
    raise NotImplementedError("TODO(ex01): ~8 lines: loop over drafts, accept iff u_i <= min(1, p/q), "
                              "at the first rejection sample the residual, else sample the bonus from p[k]")


def verify_greedy(draft_tokens: list[int], p: torch.Tensor) -> list[int]:
    """Keep drafts while they equal argmax p_i; then append the target's argmax. p: (k + 1, V)."""
    raise NotImplementedError("TODO(ex01): ~6 lines: compare each draft with p[i].argmax()")
