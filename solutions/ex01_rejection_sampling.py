"""Exercise 01, solution: speculative sampling for N sequences at once, without a Python loop.

Leviathan et al. (2023), Algorithm 1, applied row by row to a batch of N sequences that all
drafted k tokens: accept draft x_i while u_i <= min(1, p_i(x_i) / q_i(x_i)); at the first rejection
draw from norm(max(p_i - q_i, 0)); if all k survive draw a bonus token from p_{k+1}.
Greedy: keep drafts while they equal argmax p_i, then add the argmax of the next row.
"""

import torch


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """Elementwise min(1, p/q), any shape; 0 where q <= 0 (a token the draft could not propose)."""
    ratio = p_x / torch.where(q_x > 0, q_x, torch.ones_like(q_x))
    return torch.where(q_x > 0, ratio.clamp(max=1), torch.zeros_like(ratio))


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)) for every row of (..., V) tensors; a row with nothing left over
    (p <= q everywhere, i.e. p == q) falls back to p."""
    r = (p - q).clamp(min=0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / torch.where(total > 0, total, 1), p)


def verify_batch(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, uniforms: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Verify N sequences' k drafts in one go.

    Args:
        draft_tokens: (N, k) int64, row n drawn from q[n].
        p: (N, k + 1, V) target rows; q: (N, k, V) draft rows; uniforms: (N, k) in (0, 1).
    Returns:
        (N, k + 1) int64: accepted drafts, then the recovered or bonus token, then -1.
    """
    N, k = draft_tokens.shape
    idx = draft_tokens[..., None]  # (N, k, 1)
    p_x, q_x = p[:, :k].gather(-1, idx)[..., 0], q.gather(-1, idx)[..., 0]  # (N, k)
    n = (uniforms <= acceptance_probability(p_x, q_x)).long().cumprod(1).sum(1)  # (N,) leading accepts
    q_end = torch.cat([q, torch.zeros_like(p[:, :1])], 1)  # (N, k + 1, V): a zero row after the drafts
    rows = torch.arange(N)
    end = torch.multinomial(residual_distribution(p[rows, n], q_end[rows, n]), 1, generator=generator)  # (N, 1)
    pos = torch.arange(k + 1)[None, :]  # (1, k + 1)
    padded = torch.cat([draft_tokens, torch.full((N, 1), -1)], 1)  # (N, k + 1)
    out = torch.where(pos < n[:, None], padded, -1)
    return out.scatter(1, n[:, None], end)


def verify_greedy_batch(draft_tokens: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Greedy verification of N sequences: (N, k) drafts, (N, k + 1, V) target rows -> (N, k + 1)."""
    k = draft_tokens.shape[1]
    best = p.argmax(-1)  # (N, k + 1)
    n = (draft_tokens == best[:, :k]).long().cumprod(1).sum(1)  # (N,)
    return torch.where(torch.arange(k + 1)[None, :] <= n[:, None], best, -1)
