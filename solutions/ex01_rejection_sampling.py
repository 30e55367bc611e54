"""Exercise 01, solution: one verification step of speculative sampling.

Leviathan et al. (2023), Algorithm 1: accept draft x with probability min(1, p(x)/q(x)); at the
first rejection draw from norm(max(p - q, 0)); if all k drafts survive, draw a bonus token from
the target's (k+1)-th row. Greedy: keep drafts while they equal argmax p.
"""

import torch


def acceptance_probability(p_x: float, q_x: float) -> float:
    """min(1, p(x)/q(x)); a token the draft gives probability 0 is never accepted."""
    if q_x <= 0:
        return 0.0
    return min(1.0, p_x / q_x)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): (V,) -> (V,). Falls back to p when p == q (nothing left over)."""
    r = (p - q).clamp(min=0)
    total = r.sum()
    return p.clone() if total <= 0 else r / total


def verify(draft_tokens: list[int], p: torch.Tensor, q: torch.Tensor, uniforms: torch.Tensor,
           generator: torch.Generator | None = None) -> list[int]:
    """Verify k drafts; return the accepted ones plus one recovered or bonus token.

    Args:
        draft_tokens: k ids drawn from q.
        p: (k + 1, V) target rows; q: (k, V) draft rows; uniforms: (k,) in (0, 1).
    """
    out = []
    for i, x in enumerate(draft_tokens):
        if uniforms[i] <= acceptance_probability(float(p[i, x]), float(q[i, x])):
            out.append(x)
        else:
            r = residual_distribution(p[i], q[i])
            return out + [int(torch.multinomial(r, 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(draft_tokens)], 1, generator=generator))]


def verify_greedy(draft_tokens: list[int], p: torch.Tensor) -> list[int]:
    """Keep drafts while they equal argmax p_i; then append the target's argmax. p: (k + 1, V)."""
    out = []
    for i, x in enumerate(draft_tokens):
        best = int(p[i].argmax())
        out.append(best)
        if best != x:
            return out
    return out + [int(p[len(draft_tokens)].argmax())]
