"""Exercise 02, solution: the speedup theory, and one round of the speculative loop.

Leviathan et al. (2023): with i.i.d. acceptance alpha and gamma drafts, a step emits
(1 - alpha^(gamma+1)) / (1 - alpha) tokens on average and costs gamma c + 1 target forwards.
"""

import torch

from speclab.verify import verify_step


def expected_tokens(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 when alpha == 1."""
    if alpha == 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime improvement: expected_tokens / (gamma c + 1)."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def best_gamma(alpha: float, c: float, max_gamma: int = 32) -> int:
    """The gamma in 0..max_gamma with the largest speedup (first one on ties)."""
    return max(range(max_gamma + 1), key=lambda g: (speedup(alpha, g, c), -g))


def speculative_step(target, draft, tokens: list[int], gamma: int,
                     generator: torch.Generator | None = None) -> list[int]:
    """Draft gamma tokens, score them with the target, verify; return the tokens to append.

    Args:
        target, draft: callables tokens -> (V,) next-token probabilities.
    """
    ctx, drafts, q = list(tokens), [], []
    for _ in range(gamma):
        q_i = draft(ctx)
        x = int(torch.multinomial(q_i, 1, generator=generator))
        drafts.append(x)
        q.append(q_i)
        ctx.append(x)
    p = torch.stack([target(list(tokens) + drafts[:i]) for i in range(gamma + 1)])  # (gamma + 1, V)
    return verify_step(drafts, p, torch.stack(q) if q else None, generator=generator)
