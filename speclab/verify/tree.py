"""Trees and multi-draft verification (lesson 10): several candidates per position, one exact rule.

A chain drafts one token per position; a tree drafts several (siblings) and continues under each.
The target verifies the whole tree in one forward, each node attending to its ancestors only, and
walks it from the root: at each node it keeps at most one child, then goes on inside that child's
subtree. What must stay exact is the token emitted at every step of the walk.

The tree, as vLLM writes it (`speculative_token_tree`): a list of paths of child ranks,
"[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]": (0,) is the root's first child, (1,) its second,
(0, 1) the second child of (0,). Sorted breadth first (by depth, then rank), a parent always comes
before its children, so node i's index is fixed and a prefix of the list is again a tree (what a
truncated step verifies). Node 0 is the root: the last committed token, whose row gives the first
position's target distribution.

Two ways to draft siblings, two exact rules (Jeon et al., ICML 2024; EAGLE-2's evaluate_posterior):
- **deterministic children** (the drafter's top-k at a node, EAGLE and the static trees here): each
  candidate is a point mass. Accept child x with probability p(x); otherwise set p(x) = 0,
  renormalise, try the next sibling; if none is accepted, sample from what is left. This is just
  sampling from p by asking "is it x_1? else is it x_2? ..." and it is exact for any children.
- **sampled children** with their draft distribution q (`recursive_rejection_sample`): accept x_i
  with min(1, p_i(x_i) / q_i(x_i)), else p_{i+1} = norm(max(p_i - q_i, 0)). Drawn i.i.d. (with
  replacement), q_i = q for every sibling (SpecInfer's MSS); drawn without replacement, q_{i+1} is q
  with the drawn tokens removed and renormalised, the proposal x_{i+1} was actually drawn from.
  Verifying with-replacement siblings with the without-replacement update is the classic bug: the
  law test catches it (tests/test_10_tree.py). The engine draws children so (without replacement)
  for a sampled request under `draft_sample_method: "probabilistic"` with a static tree, and walks
  them with `sample_tree_drawn`; otherwise its children are the drafter's top-k.
Greedy and seeded requests walk the tree against the target's own sample at each node (its argmax,
or its keyed race sample): a child is kept iff it equals that sample, so the output is the target's
sample at every position whatever was drafted.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property

import torch

from speclab.sampling import sample_cdf

__all__ = ["TokenTree", "chain", "star_literal", "parse_tree", "from_parents", "walk", "sample_tree",
           "recursive_rejection_sample", "draw_children", "sample_tree_drawn"]

FIX = ('write it as vLLM does: a list of paths of child ranks, parents before children, e.g. '
       '"[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"')


@dataclass(frozen=True)
class TokenTree:
    """A draft tree's shape: nodes 1..N in breadth-first order, node 0 the root.

    Attributes:
        parents: (N + 1,) parent of each node; parents[0] = -1.
        ranks: (N + 1,) which child of its parent each node is (0 = the drafter's most likely); ranks[0] = 0.
    """

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        """N, the draft tokens verified: vLLM's num_speculative_tokens for a tree."""
        return len(self.parents) - 1

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """(N + 1,) depth of each node (the root's 0): node i's position is the root's plus depths[i]."""
        d = [0]
        for i in range(1, len(self.parents)):
            d.append(d[self.parents[i]] + 1)
        return tuple(d)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """children[i]: the nodes whose parent is i, by rank."""
        out = [[] for _ in self.parents]
        for i in range(1, len(self.parents)):
            out[self.parents[i]].append(i)
        return tuple(tuple(sorted(c, key=lambda j: self.ranks[j])) for c in out)

    def ancestors(self, i: int) -> list[int]:
        """The path root -> i (both included)."""
        path = []
        while i >= 0:
            path.append(i)
            i = self.parents[i]
        return path[::-1]

    def attention_mask(self) -> torch.Tensor:
        """(N + 1, N + 1) bool: row i sees column j iff j is i or one of its ancestors. This is the part of
        the mask among the step's new tokens; every node also sees the committed cache before the root."""
        n = len(self.parents)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            mask[i, self.ancestors(i)] = True
        return mask

    def truncate(self, num_nodes: int) -> "TokenTree":
        """The first num_nodes nodes (breadth first, so still a tree): what a truncated step verifies."""
        return TokenTree(self.parents[:num_nodes + 1], self.ranks[:num_nodes + 1])

    def up_to_depth(self, depth: int) -> "TokenTree":
        """The nodes at depth <= depth (a prefix: breadth first)."""
        return self.truncate(sum(1 for d in self.depths[1:] if d <= depth))

    def paths(self) -> list[tuple[int, ...]]:
        """Back to vLLM's literal: each node's child ranks from the root."""
        return [tuple(self.ranks[j] for j in self.ancestors(i)[1:]) for i in range(1, len(self.parents))]


def chain(k: int) -> TokenTree:
    """k drafts in a line: vLLM's default tree `[(0,), (0, 0), ...]`."""
    return TokenTree(tuple(range(-1, k)), (0,) * (k + 1))


def star_literal(k: int) -> str:
    """k drafts side by side, all children of the root (the drafter's k most likely next tokens), as vLLM's
    `speculative_token_tree` literal: "[(0,), (1,), ..., (k - 1,)]"."""
    return "[" + ", ".join(f"({i},)" for i in range(k)) + "]"


def parse_tree(literal, max_nodes: int | None = None) -> TokenTree:
    """vLLM's `speculative_token_tree` (a string, or a list of tuples) -> TokenTree, sorted breadth first
    as vLLM sorts it; a clear error for what is not a tree (a node whose parent is missing, a duplicate,
    a negative rank) or has more nodes than `max_nodes` (the slots verified per step)."""
    if isinstance(literal, str):
        try:
            literal = ast.literal_eval(literal)
        except (ValueError, SyntaxError) as err:
            raise ValueError(f"speculative_token_tree {literal!r} is not a Python literal: {FIX}") from err
    if not isinstance(literal, (list, tuple)) or not literal:
        raise ValueError(f"speculative_token_tree must be a non-empty list of tuples, got {literal!r}: {FIX}")
    paths = []
    for node in literal:
        if not isinstance(node, (list, tuple)) or not node or \
                not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in node):
            raise ValueError(f"tree node {node!r} is not a non-empty tuple of ranks >= 0: {FIX}")
        paths.append(tuple(node))
    if len(set(paths)) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise ValueError(f"tree node {dup} appears twice: each path names one node")
    if max_nodes is not None and len(paths) > max_nodes:
        raise ValueError(f"the tree has {len(paths)} nodes and a step verifies at most {max_nodes}: "
                         f"num_speculative_tokens must equal the number of tree nodes ({len(paths)})")
    known = set(paths)
    for p in paths:
        if len(p) > 1 and p[:-1] not in known:
            raise ValueError(f"tree node {p} has no parent {p[:-1]} in the tree: every prefix of a path must be a node")
    paths.sort(key=lambda p: (len(p), p))
    index = {p: i + 1 for i, p in enumerate(paths)}
    parents = (-1,) + tuple(index[p[:-1]] if len(p) > 1 else 0 for p in paths)
    return TokenTree(parents, (0,) + tuple(p[-1] for p in paths))


def from_parents(parents, ranks=None) -> TokenTree:
    """A tree from per-node parents (node 0 the root; a dynamic tree builds its own); checked: every
    parent comes before its child. `ranks` default to the order of siblings."""
    parents = tuple(int(p) for p in parents)
    if not parents or parents[0] != -1:
        raise ValueError(f"parents[0] must be -1 (the root), got {parents[:1]}")
    for i, p in enumerate(parents[1:], start=1):
        if not 0 <= p < i:
            raise ValueError(f"node {i}'s parent {p} does not come before it: parents must precede children")
    if ranks is None:
        seen, ranks = {}, [0]
        for p in parents[1:]:
            ranks.append(seen.get(p, 0))
            seen[p] = ranks[-1] + 1
    return TokenTree(parents, tuple(int(r) for r in ranks))


# ----------------------------------------------------------------------------------------------
# Verifying a tree of drafted tokens


def walk(tree: TokenTree, tokens, targets) -> tuple[list[int], list[int]]:
    """Walk the tree against the target's own sample at each node: a child is kept iff its token equals
    the target's sample at its parent. Greedy (targets = argmax rows) and seeded requests (keyed samples).

    Args:
        tokens: (N,) the drafted token of nodes 1..N.
        targets: (N + 1,) the target's token at each node (row i: the token after node i).
    Returns:
        (accepted nodes in path order, tokens to append: the accepted drafts then the target's token).
    """
    tokens = [int(t) for t in tokens]
    targets = [int(t) for t in targets]
    node, path = 0, []
    while True:
        nxt = next((c for c in tree.children[node] if tokens[c - 1] == targets[node]), None)
        if nxt is None:
            return path, [tokens[c - 1] for c in path] + [targets[node]]
        path.append(nxt)
        node = nxt


def sample_tree(tree: TokenTree, tokens, probs: torch.Tensor, generator: torch.Generator | None = None,
                uniforms=None) -> tuple[list[int], list[int]]:
    """Exact sampling over a tree of deterministic children (each a point mass; vLLM and EAGLE's top-k).

    At a node with target distribution p, try its children in rank order: accept child x with
    probability p(x) / (mass left); otherwise remove x (p(x) = 0) and try the next. If a child is
    accepted, continue at it; if none is, emit a token from the p that is left and stop. A duplicate
    child (the same token twice) is never accepted the second time: its mass is already zero.

    Args:
        tokens: (N,) drafted tokens of nodes 1..N; probs: (N + 1, V) the target's probabilities at each node.
        uniforms: optional iterable of U(0, 1) draws for the accept tests (else from `generator`).
    Returns:
        (accepted nodes in path order, tokens to append).
    """
    tokens = [int(t) for t in tokens]
    draws = iter(uniforms) if uniforms is not None else None
    node, path = 0, []
    while True:
        p = probs[node].double().clone()
        nxt = None
        for c in tree.children[node]:
            x, mass = tokens[c - 1], float(p.sum())
            u = next(draws) if draws is not None else float(torch.rand((), generator=generator, dtype=torch.float64))
            if mass > 0 and u * mass < float(p[x]):
                nxt = c
                break
            p[x] = 0.0
        if nxt is None:
            if float(p.sum()) <= 0:  # every token with mass was drafted and rejected: cannot happen exactly
                p = probs[node].double()
            return path, [tokens[c - 1] for c in path] + [int(sample_cdf(p, generator))]  # multinomial's law
        path.append(nxt)
        node = nxt


# ----------------------------------------------------------------------------------------------
# Sampled siblings with a draft distribution (multi-draft at one node)


def draw_children(q: torch.Tensor, m: int, *, replacement: bool, generator: torch.Generator | None = None) -> list[int]:
    """m sibling drafts from q: i.i.d. (replacement=True) or without replacement (each from q with the
    tokens already drawn removed and renormalised)."""
    return [int(t) for t in torch.multinomial(q, m, replacement=replacement, generator=generator)]


def recursive_rejection_sample(p: torch.Tensor, drafts, q: torch.Tensor, *, without_replacement: bool,
                               generator: torch.Generator | None = None, uniforms=None,
                               noise: torch.Tensor | None = None) -> tuple[int, int]:
    """Verify m siblings drafted from q at one node; returns (index of the accepted sibling or -1, the token).

    Args:
        p: (V,) the target's distribution at the node; q: (V,) the draft's; drafts: the m siblings.
        without_replacement: how the siblings were drawn. True: Jeon et al.'s recursive rejection
            sampling, each sibling tested against the proposal it was drawn from (q with the earlier
            siblings removed, renormalised). False: SpecInfer's MSS for i.i.d. siblings (q every time).
            Saying True for i.i.d. siblings is the classic bug, and the output is then biased.
        uniforms: optional (m,) U(0, 1) draws for the tests; noise: optional (V,) Exp(1) noise, the final
            token then being argmax r / noise (the race); both drawn from `generator` when None.
    """
    r, prop = p.double().clone(), q.double().clone()
    for i, x in enumerate(int(t) for t in drafts):
        prop = prop / prop.sum()
        u = float(uniforms[i]) if uniforms is not None else float(torch.rand((), generator=generator,
                                                                               dtype=torch.float64))
        if prop[x] > 0 and u * prop[x] < r[x]:  # accept with min(1, r(x) / prop(x))
            return i, x
        r = (r - prop).clamp(min=0)
        if r.sum() <= 0:  # r == prop: nothing left to correct (cannot accept x's rejection otherwise)
            r = p.double().clone()
        r = r / r.sum()
        if without_replacement:  # the next sibling was drawn from q without the tokens drawn so far
            prop[x] = 0.0
            if prop.sum() <= 0:
                break
    if noise is not None:
        return -1, int((r / noise.double()).argmax())
    return -1, int(sample_cdf(r, generator))  # torch.multinomial's law, faster over a large vocabulary


def sample_tree_drawn(tree: TokenTree, tokens, probs: torch.Tensor, draft_probs: torch.Tensor,
                      generator: torch.Generator | None = None) -> tuple[list[int], list[int]]:
    """Exact sampling over a tree whose siblings were drawn from the drafter's q without replacement
    (speclab's `draft_sample_method: "probabilistic"` with a static tree; Jeon et al.'s recursive
    rejection sampling at every node).

    At a node, its children in rank order are the drafter's draws from q there, each from q with the
    earlier ones removed: `recursive_rejection_sample` keeps one of them (the walk goes on inside it)
    or emits a token from what is left of p (the walk ends). A leaf emits from p. Children past the end
    of q's support (a top-k or top-p q with fewer tokens than the node has children) are never tested.

    Args:
        tokens: (N,) drafted tokens of nodes 1..N; probs: (N + 1, V) the target's probabilities at
            each node; draft_probs: (N, V), row i - 1 the q node i was drawn from (its parent's, so
            siblings share a row).
    Returns:
        (accepted nodes in path order, tokens to append).
    """
    tokens = [int(t) for t in tokens]
    node, path = 0, []
    while True:
        kids = tree.children[node]
        if kids:
            i, x = _on_support(probs[node], [tokens[c - 1] for c in kids], draft_probs[kids[0] - 1], generator)
        else:
            i, x = -1, int(sample_cdf(probs[node], generator))  # a leaf: torch.multinomial's law, 1.1 -> 0.05 ms
        if i < 0:
            return path, [tokens[c - 1] for c in path] + [x]
        path.append(kids[i])
        node = kids[i]


def _on_support(p: torch.Tensor, drafts: list[int], q: torch.Tensor, generator) -> tuple[int, int]:
    """`recursive_rejection_sample` (siblings without replacement) over q's support and the drafts, every
    other token lumped into one outcome; the same law. A token q gives no mass is never proposed, so its
    residual stays p(y) / Z at every step, like every other such token: one outcome can carry their mass,
    and when it comes out, the token is drawn from p over them. Over SmolLM2's 49152 tokens, with an EAGLE
    head's 8192-token q, three rejected siblings took 0.35 ms instead of 1.50 (2026-12-07, Zen 4, one thread)."""
    support = q.nonzero().flatten()  # sorted
    drafted = torch.tensor(drafts, device=q.device)
    at = torch.searchsorted(support, drafted).clamp(max=support.numel() - 1)
    drawn = int((support[at] == drafted).long().cumprod(0).sum())  # children past q's support are never tested
    p64 = p.double()
    p_s = p64[support]
    rest = (p64.sum() - p_s.sum()).clamp(min=0)
    zero = torch.zeros(1, dtype=torch.float64, device=q.device)
    i, y = recursive_rejection_sample(torch.cat([p_s, rest[None]]), at[:drawn].tolist(),
                                      torch.cat([q[support].double(), zero]), without_replacement=True,
                                      generator=generator)
    if y < support.numel():
        return i, int(support[y])
    outside = p64.clone()
    outside[support] = 0.0  # the lumped outcome: a token q never proposes, in proportion to p
    return i, int(sample_cdf(outside, generator))
