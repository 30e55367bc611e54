"""Exercise 02, solution: tokens per step when acceptance varies by position, and a loop step
that stops drafting when the draft is unsure.

Leviathan et al. (2023) assume one acceptance rate alpha for every position. Measured acceptance
is not flat (lesson 04): position i is accepted with probability alpha_i given that 0..i-1 were, so
a step emits 1 + alpha_1 + alpha_1 alpha_2 + ... tokens. Stopping the draft early when its own
top probability is low (as dynamic-length drafters do) keeps the output exact, because the decision
to stop is made before the next token is drawn and depends only on the context.
"""

import torch

from speclab.verify import verify_step


def expected_tokens_per_position(alphas: list[float]) -> float:
    """1 + a_1 + a_1 a_2 + ... + a_1...a_gamma: tokens per step with conditional acceptances alphas."""
    total, reach = 1.0, 1.0
    for a in alphas:
        reach *= a
        total += reach
    return total


def speedup(alphas: list[float], c: float) -> float:
    """Expected walltime improvement of drafting gamma = len(alphas) tokens at cost ratio c."""
    return expected_tokens_per_position(alphas) / (len(alphas) * c + 1)


def best_gamma(alphas: list[float], c: float) -> int:
    """The gamma in 0..len(alphas) whose prefix alphas[:gamma] gives the largest speedup (smallest on ties)."""
    return max(range(len(alphas) + 1), key=lambda g: (speedup(alphas[:g], c), -g))


def speculative_step(target, draft, tokens: list[int], gamma: int, min_draft_prob: float = 0.0,
                     generator: torch.Generator | None = None) -> list[int]:
    """One step: draft up to gamma tokens, stopping before position i when max q_i < min_draft_prob;
    score the drafts with len(drafts) + 1 target rows; verify; return the tokens to append.

    Args:
        target, draft: callables tokens -> (V,) next-token probabilities.
    """
    ctx, drafts, q = list(tokens), [], []
    for _ in range(gamma):
        q_i = draft(ctx)
        if float(q_i.max()) < min_draft_prob:  # unsure: stop drafting (decided before drawing x)
            break
        x = int(torch.multinomial(q_i, 1, generator=generator))
        drafts.append(x)
        q.append(q_i)
        ctx.append(x)
    p = torch.stack([target(list(tokens) + drafts[:i]) for i in range(len(drafts) + 1)])  # (k + 1, V)
    return verify_step(drafts, p, torch.stack(q) if q else None, generator=generator)
