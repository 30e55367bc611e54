"""Exercise 10: beyond one chain: block verification, trees, multi-draft, and a lossy rule caught.

Lesson 10 changes both ends of the speculative loop. Here you write each piece from scratch, as pure
functions on small tensors: block verification for a batch (keep the LAST position that passes), a
draft tree's layout (vLLM's literal, positions by depth, the ancestor-only mask), the greedy tree walk,
KV compaction of the accepted path, the rule for deterministic (top-k) children, recursive rejection
sampling over sampled siblings (with and without replacement), and the law check that tells an exact rule from a lossy one. Each is graded against
speclab's own function (speclab.verify.block, speclab.verify.tree, the runner's `_compact`) or against
the target's law. Fill in the functions, then grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex10_beyond_one_chain.py
Lesson: notebooks/10_beyond_one_chain.ipynb. Notation: p = target, q = draft, k = drafts per step.
"""

import torch


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
    raise NotImplementedError("TODO(ex10): ~20 lines: prefix ratios rho (a loop over k is fine), thresholds h_i = Z / (Z + 1 - "
                              "rho_i) (h_k = rho_k), tau = the LAST i with u_i <= h_i (not the first failure), then the block "
                              "residual max(rho_tau p - q, 0) or the bonus row")


def tree_parents(literal: str) -> list[int]:
    """vLLM's `speculative_token_tree` literal -> parents of nodes 0..N (node 0 the root, parent -1),
    the nodes numbered breadth first (by depth, then by path), as vLLM sorts them."""
    raise NotImplementedError("TODO(ex10): 4 lines: ast.literal_eval, sort by (depth, path), index each path, look up each "
                              "path[:-1]")


def tree_positions(parents: list[int], start: int) -> list[int]:
    """Each node's position: the root's (`start`) plus its depth. Siblings share a position."""
    raise NotImplementedError("TODO(ex10): 4 lines: a node's depth is its parent's + 1")


def tree_attention_mask(parents: list[int]) -> torch.Tensor:
    """(N + 1, N + 1) bool: row i sees column j iff j is i or one of i's ancestors (never a sibling)."""
    raise NotImplementedError("TODO(ex10): 5 lines: walk each node's parent chain up to the root")


def greedy_tree_walk(parents: list[int], tokens: list[int], targets: list[int]) -> tuple[list[int], list[int]]:
    """Walk a tree against the target's own token at each node (greedy: its argmax).

    Args:
        tokens: the drafted token of nodes 1..N; targets: the target's token after each node 0..N.
    Returns:
        (accepted nodes, root side first; tokens to append: their drafts, then the target's token at the last).
    """
    raise NotImplementedError("TODO(ex10): 6 lines: from the root, step into the child whose token equals the target's token at "
                              "the node")


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
    raise NotImplementedError("TODO(ex10): 3 lines: node path[j] goes to start + 1 + j (start is the root's position)")


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
    raise NotImplementedError("TODO(ex10): 8 lines: try the children in order; accept with p_left(x) / mass left; "
                              "else set p_left(x) = 0; if none is accepted, race over what is left")


def recursive_rejection_sample(p: torch.Tensor, drafts: list[int], q: torch.Tensor, uniforms: torch.Tensor,
                               noise: torch.Tensor, without_replacement: bool) -> tuple[int, int]:
    """Verify m sibling drafts at one node (SpecInfer's MSS / Jeon et al.'s recursive rejection sampling).

    Args:
        p: (V,) target; q: (V,) draft; drafts: the m siblings, drawn from q i.i.d. (without_replacement
            False) or without replacement (True); uniforms: (m,) one per test; noise: (V,) Exp(1).
    Returns:
        (index of the accepted sibling, its token), or (-1, a token from the last residual, argmax r / noise).
    """
    raise NotImplementedError("TODO(ex10): ~10 lines: accept x with min(1, r(x) / prop(x)); on rejection r = norm(max(r - prop, "
                              "0)); remove x from prop only if the siblings were drawn without replacement")


def first_token_p_value(rule, p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator) -> float:
    """The law check of a verification rule on its first emitted token: run n requests through `rule`
    (speclab.verify.rejection_sample's signature), each with drafts x_i ~ q_i, and return the p-value of
    Pearson's chi-squared test that the first tokens are distributed as p[0]. Exact rules pass (p-value
    not tiny); a lossy rule fails (p < 1e-4), whatever its acceptance rate.

    Args:
        p: (k + 1, V) target rows; q: (k, V) draft rows (the same for every request).
    """
    raise NotImplementedError("TODO(ex10): ~8 lines: draw n * k drafts from q, one call of `rule` for n requests, count the "
                              "first column, Pearson's chi-squared against p[0] (scipy.stats.chi2.sf)")
