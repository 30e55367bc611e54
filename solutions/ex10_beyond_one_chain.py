"""Exercise 10 (reference answers): beyond one chain: block verification, trees, multi-draft, lossy rules.

Pure functions on small tensors, each graded against speclab's own (speclab.verify.block,
speclab.verify.tree, the runner's KV compaction) or against the target's law:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex10_beyond_one_chain.py
Lesson: notebooks/10_beyond_one_chain.ipynb. Notation: p = target, q = draft, k = drafts per step.
"""

import ast

import numpy as np
import torch
from scipy import stats as _sp


def block_verify_batch(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, uniforms: torch.Tensor,
                       noise: torch.Tensor) -> torch.Tensor:
    """Block verification (Sun et al., ICLR 2025, Algorithm 2) of N requests with k drafts each.

    Args:
        draft_tokens: (N, k) int64, row n drawn from q[n]; p: (N, k + 1, V) target rows; q: (N, k, V)
            draft rows; uniforms: (N, k) in (0, 1), one per position; noise: (N, V) Exp(1) for the race.
    Returns:
        (N, k + 1) int64: the tau kept drafts, then the token from the bonus row (tau = k) or the
        block residual norm(max(rho_tau p_tau - q_tau, 0)), sampled as argmax r / noise; then -1.
    """
    N, k = draft_tokens.shape
    p, q = p.double(), q.double()
    n = torch.arange(N)
    rho = torch.ones(N, k + 1, dtype=torch.float64)
    h = torch.zeros(N, k, dtype=torch.float64)
    for i in range(k):
        x = draft_tokens[:, i]
        p_x, q_x = p[n, i, x], q[n, i, x]
        rho[:, i + 1] = torch.where(q_x > 0, torch.clamp(rho[:, i] * p_x / torch.where(q_x > 0, q_x, 1.0), max=1.0), 0.0)
    for i in range(1, k + 1):
        if i < k:
            z = (rho[:, i, None] * p[:, i] - q[:, i]).clamp(min=0).sum(-1)
            denom = z + 1 - rho[:, i]
            h[:, i - 1] = torch.where(denom > 0, z / torch.where(denom > 0, denom, 1.0), 1.0)
        else:
            h[:, i - 1] = rho[:, k]
    passed = uniforms.double() <= h  # (N, k)
    tau = (passed * torch.arange(1, k + 1)).amax(1) if k else torch.zeros(N, dtype=torch.long)  # the LAST pass
    p_end = p[n, tau]  # (N, V)
    q_end = q[n, tau.clamp(max=max(k - 1, 0))] if k else torch.zeros_like(p_end)
    r = torch.where((tau < k)[:, None], (rho[n, tau][:, None] * p_end - q_end).clamp(min=0), p_end)
    r = torch.where(r.amax(-1, keepdim=True) > 0, r, p_end)
    out = torch.full((N, k + 1), -1, dtype=torch.long)
    out[:, :k] = torch.where(torch.arange(k)[None] < tau[:, None], draft_tokens, -1)
    out[n, tau] = (r / noise.double()).argmax(-1)
    return out


def tree_parents(literal: str) -> list[int]:
    """vLLM's `speculative_token_tree` literal -> parents of nodes 0..N (node 0 the root, parent -1),
    the nodes numbered breadth first (by depth, then by path), as vLLM sorts them."""
    paths = sorted((tuple(t) for t in ast.literal_eval(literal)), key=lambda t: (len(t), t))
    index = {t: i + 1 for i, t in enumerate(paths)}
    return [-1] + [index[t[:-1]] if len(t) > 1 else 0 for t in paths]


def tree_positions(parents: list[int], start: int) -> list[int]:
    """Each node's position: the root's (`start`) plus its depth. Siblings share a position."""
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return [start + d for d in depth]


def tree_attention_mask(parents: list[int]) -> torch.Tensor:
    """(N + 1, N + 1) bool: row i sees column j iff j is i or one of i's ancestors (never a sibling)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def greedy_tree_walk(parents: list[int], tokens: list[int], targets: list[int]) -> tuple[list[int], list[int]]:
    """Walk a tree against the target's own token at each node (greedy: its argmax).

    Args:
        tokens: the drafted token of nodes 1..N; targets: the target's token after each node 0..N.
    Returns:
        (accepted nodes, root side first; tokens to append: their drafts, then the target's token at the last).
    """
    node, path = 0, []
    while True:
        child = next((c for c in range(1, len(parents)) if parents[c] == node and tokens[c - 1] == targets[node]), None)
        if child is None:
            return path, [tokens[c - 1] for c in path] + [targets[node]]
        path.append(child)
        node = child


def compact_kv(kv: torch.Tensor, start: int, path: list[int]) -> tuple[torch.Tensor, int]:
    """KV compaction after a tree step.

    Args:
        kv: (L, H, D) one request's keys (or values) by cache position; the step wrote node i (0 = the
            root, the last committed token) at position start + i.
        path: the accepted nodes, root side first (breadth-first indices, increasing).
    Returns:
        (a new kv with node path[j] moved to position start + 1 + j, the cache's valid length after
        the step: the root and the accepted path; the token emitted after them is written next step).
    """
    out = kv.clone()
    for j, node in enumerate(path):
        out[start + 1 + j] = kv[start + node]
    return out, start + 1 + len(path)


def top_k_children_verify(p: torch.Tensor, children: list[int], uniforms: torch.Tensor,
                          noise: torch.Tensor) -> tuple[int, int]:
    """Verify deterministic children at one node (the drafter's top-k, each a point mass; EAGLE's rule).

    Args:
        p: (V,) the target at the node; children: their tokens in rank order (a token may repeat);
        uniforms: (len(children),) one per test; noise: (V,) Exp(1).
    Returns:
        (index of the accepted child, its token): child x is accepted iff u * (mass left) < p_left(x), where
        p_left is p with the children already tried set to 0; or (-1, argmax p_left / noise) if none is.
    """
    left = p.double().clone()
    for i, x in enumerate(children):
        mass = float(left.sum())
        if mass > 0 and float(uniforms[i]) * mass < float(left[x]):
            return i, int(x)
        left[x] = 0.0
    if float(left.sum()) <= 0:
        left = p.double().clone()
    return -1, int((left / noise.double()).argmax())


def recursive_rejection_sample(p: torch.Tensor, drafts: list[int], q: torch.Tensor, uniforms: torch.Tensor,
                               noise: torch.Tensor, without_replacement: bool) -> tuple[int, int]:
    """Verify m sibling drafts at one node (SpecInfer's MSS / Jeon et al.'s recursive rejection sampling).

    Args:
        p: (V,) target; q: (V,) draft; drafts: the m siblings, drawn from q i.i.d. (without_replacement
            False) or without replacement (True); uniforms: (m,) one per test; noise: (V,) Exp(1).
    Returns:
        (index of the accepted sibling, its token), or (-1, a token from the last residual, argmax r / noise).
    """
    r, prop = p.double().clone(), q.double().clone()
    for i, x in enumerate(drafts):
        prop = prop / prop.sum()
        if prop[x] > 0 and float(uniforms[i]) * prop[x] < r[x]:
            return i, int(x)
        r = (r - prop).clamp(min=0)
        r = r / r.sum() if r.sum() > 0 else p.double().clone()
        if without_replacement:
            prop[x] = 0.0
            if prop.sum() <= 0:
                break
    return -1, int((r / noise.double()).argmax())


def first_token_p_value(rule, p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator) -> float:
    """The law check of a verification rule on its first emitted token: run n requests through `rule`
    (speclab.verify.rejection_sample's signature), each with drafts x_i ~ q_i, and return the p-value of
    Pearson's chi-squared test that the first tokens are distributed as p[0]. Exact rules pass (p-value
    not tiny); a lossy rule fails (p < 1e-4), whatever its acceptance rate.

    Args:
        p: (k + 1, V) target rows; q: (k, V) draft rows (the same for every request).
    """
    k, V = q.shape
    drafts = torch.multinomial(q, n, replacement=True, generator=generator).T.reshape(-1)  # (n * k,) row r = request
    out = rule(drafts, [k] * n, p.repeat(n, 1), q.repeat(n, 1), generator=generator)
    counts = np.bincount(out[:, 0].numpy(), minlength=V).astype(np.float64)
    expected = n * p[0].double().numpy()
    if (counts[expected == 0] > 0).any():
        return 0.0
    s = expected > 0
    stat = float(((counts[s] - expected[s]) ** 2 / expected[s]).sum())
    return float(_sp.chi2.sf(stat, int(s.sum()) - 1))
