"""Drafting a tree instead of a chain (lesson 10): which nodes to draft, and in what order to run them.

Any drafter that can run a batch of nodes with tree attention (the draft model, an EAGLE head)
drafts a tree the same way: from its distribution at the root (the last committed token), it picks
the root's children; to pick the children of a node it must first run that node (one forward per
depth, every request's nodes of that depth together, each node seeing its ancestors only). Two ways
to choose the shape:

- **static** (vLLM's `speculative_token_tree`): a fixed list of paths of child ranks, the same for
  every request and step. Node (0, 1) is the second most likely child of the most likely child.
- **dynamic** (EAGLE-2, Li et al. 2024, with SGLang's knob names): `speculative_num_steps` depths;
  at each, only the `speculative_eagle_topk` most valuable nodes of the newest depth are run, each
  getting `speculative_eagle_topk` children; a node's value is the product of the draft's
  probabilities along its path. At the end the `speculative_num_draft_tokens - 1` most valuable nodes
  of the whole tree are kept (a connected tree: a node is never worth more than its parent).
Children are the drafter's top-k at a node, a deterministic function of the prefix, so the verifier
treats each as a point mass (speclab.verify.tree.sample_tree): exact whatever the shape. With
`draft_sample_method: "probabilistic"` (speclab's, static trees only) a sampled request's children
are instead drawn from the drafter's q at the node without replacement, in rank order, and each
keeps that q for the verifier (speclab.verify.tree.sample_tree_drawn): at T = 1 a top-k child is
kept with probability p(x) alone, a drawn one with min(1, p/q), and on SmolLM2's qa and chat chats
three drawn children at the root were accepted 0.60 and 0.51 of the time, three top-k ones 0.39 and
0.34 (one drawn child: 0.45 and 0.35).

The drafter gives `draft_trees` one callback, `run(nodes)`: per request, the nodes to run now, each
a `TreeNode` whose `slot` is its index among the nodes run so far (the drafter writes its key and
value at the tree's first free slot + `slot`) and whose `sees` are the slots of its ancestors run
before and its own; it returns their logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speclab.sampling import logits_to_probs, sample_cdf
from speclab.verify.tree import TokenTree, from_parents, parse_tree

__all__ = ["TreeShape", "TreeNode", "check_tree", "draft_trees", "draw_siblings", "tree_mask"]


@dataclass(frozen=True)
class TreeShape:
    """What to draft: a static tree, or EAGLE-2's dynamic one (SGLang's three knobs)."""

    static: TokenTree | None = None
    num_steps: int = 0
    topk: int = 0
    num_draft_tokens: int = 0

    @classmethod
    def from_config(cls, spec) -> "TreeShape | None":
        """From a SpeculativeConfig's `speculative_token_tree` or `speculative_*` dynamic knobs; None: a chain."""
        if spec.speculative_token_tree is not None:
            return cls(static=parse_tree(spec.speculative_token_tree))
        if spec.speculative_eagle_topk is not None:
            return cls(num_steps=spec.speculative_num_steps, topk=spec.speculative_eagle_topk,
                       num_draft_tokens=spec.speculative_num_draft_tokens)
        return None

    @property
    def num_nodes(self) -> int:
        """Draft tokens verified per step (vLLM's num_speculative_tokens for a tree)."""
        return self.static.num_nodes if self.static is not None else self.num_draft_tokens - 1

    @property
    def max_run(self) -> int:
        """The most nodes a drafter runs per request and step: the cache slots its tree needs."""
        if self.static is not None:
            return sum(1 for c in self.static.children[1:] if c)
        return max(1, (self.num_steps - 1) * self.topk)


def check_tree(tree: TreeShape | None, num_speculative_tokens: int, sample_method: str,
               vocab_size: int | None = None) -> None:
    """A drafter's constructor checks its tree: k must be its node count (vLLM's rule), drafts its top-k, and no
    node has more children than the tokens the drafter scores (`vocab_size`: a reduced draft vocabulary's)."""
    if tree is None:
        return
    width = tree.topk if tree.static is None else max(len(c) for c in tree.static.children)
    if vocab_size is not None and width > vocab_size:
        raise ValueError(f"the tree gives a node {width} children but the drafter scores only {vocab_size} tokens "
                         f"(its draft vocabulary): the extra children would be tokens of probability 0; use a tree "
                         f"at most {vocab_size} wide or a larger draft_vocab_size")
    if tree.num_nodes != num_speculative_tokens:
        raise ValueError(f"the tree has {tree.num_nodes} draft nodes and num_speculative_tokens is "
                         f"{num_speculative_tokens}: with a tree, num_speculative_tokens is its node count")
    if sample_method != "greedy" and tree.static is None:
        raise ValueError("EAGLE-2's dynamic tree ranks its nodes by the draft's confidence, so its children are the "
                         "drafter's top-k: draft_sample_method must be 'greedy' with a dynamic tree (a static "
                         "speculative_token_tree may draw its children with 'probabilistic')")


@dataclass
class TreeNode:
    """A node while the tree grows. parent: index in the request's node list (0 = root)."""

    token: int
    parent: int
    depth: int
    rank: int
    value: float = 0.0  # log of the draft's probability of the path
    slot: int = -1  # index among the nodes run so far (-1: not run)
    sees: list[int] = field(default_factory=list)
    logits: torch.Tensor | None = None
    q: torch.Tensor | None = None  # (V,) the distribution the node was drawn from (its parent's); None: top-k


def tree_mask(nodes: list[TreeNode]) -> torch.Tensor:
    """(len(nodes), last slot + 1) bool: which of the tree's slots each node being run sees."""
    width = max(n.slot for n in nodes) + 1
    mask = torch.zeros(len(nodes), width, dtype=torch.bool)
    for i, n in enumerate(nodes):
        mask[i, n.sees] = True
    return mask


def draft_trees(root_logits: torch.Tensor, shape: TreeShape, run, draws=None) -> list[tuple]:
    """Grow one tree per request from the drafter's logits at each root (B, V).

    Args:
        run: callback, list (per request) of lists of TreeNode to run -> list of (m_b, V) logits.
        draws: for a static tree, per request None (top-k children) or a callback (logits row, m) ->
            (m tokens, q) or None, drawing a node's m children (`draw_siblings`).
    Returns:
        per request, (tokens of nodes 1..N, their TokenTree, (N, V) q rows or None), breadth first.
    """
    trees = [[TreeNode(-1, -1, 0, 0, logits=row)] for row in root_logits]
    if shape.static is not None:
        return [_finish(nodes, shape) for nodes in _grow_static(trees, shape, run, draws or [None] * len(trees))]
    return [_finish(nodes, shape) for nodes in _grow_dynamic(trees, shape, run)]


def draw_siblings(params, generator: torch.Generator | None, vocab: torch.Tensor | None = None):
    """A sampled request's `draws` callback: a node's m children drawn from its q (the request's
    temperature, top-k, top-p, as the target's p) without replacement, from `generator`. None for a
    greedy or seeded request: top-k children, which the verifier walks against the target's own
    sample (where the most likely children are the best bet).

    `vocab`: the sorted token ids the drafter scores (a reduced draft vocabulary, whose logits are -inf
    elsewhere), or None for the whole vocabulary. q is computed over them and placed in a (V,) row for
    the verifier; top-k and top-p over them are those over the whole row, whose other tokens have
    probability 0. The children are drawn one after another, each by the inverse CDF from what the earlier
    ones left (successive sampling: `torch.multinomial`'s law without replacement). Over SmolLM2's
    8192-token head, three children took 0.14-0.19 ms this way, and about 0.4 ms by q over 49152 tokens
    (0.10), its nonzero entries (0.12) and `torch.multinomial` (0.18) (2026-12-07, Zen 5 EPYC, one thread)."""
    if params.greedy or params.seed is not None:
        return None

    def draw(logits: torch.Tensor, m: int) -> tuple[list[int], torch.Tensor]:
        scored = logits if vocab is None else logits[vocab]
        q_scored = logits_to_probs(scored, params.temperature, params.top_k, params.top_p)
        left = q_scored.double()
        picks = []
        for _ in range(min(m, int((left > 0).sum()))):
            pick = int(sample_cdf(left, generator))  # a token of probability 0 is never drawn
            picks.append(pick)
            left[pick] = 0
        q = q_scored if vocab is None else q_scored.new_zeros(logits.shape[-1]).index_copy_(0, vocab, q_scored)
        tokens = picks if vocab is None else vocab[picks].tolist()
        if len(tokens) < m:  # q's whole support is drawn: the other children are never tested (q = 0)
            tokens += [t for t in logits.topk(m + len(tokens)).indices.tolist() if t not in tokens][:m - len(tokens)]
        return tokens, q
    return draw


def _run(trees, wanted, run) -> None:
    """Run the nodes `wanted` (per request, node indices) and store their logits."""
    batch = []
    for nodes, idx in zip(trees, wanted):
        used = sum(1 for n in nodes if n.slot >= 0)
        for j, i in enumerate(idx):
            node = nodes[i]
            node.slot = used + j
            node.sees = [nodes[a].slot for a in _ancestors(nodes, i)]
        batch.append([nodes[i] for i in idx])
    if not any(batch):
        return
    for nodes_run, logits in zip(batch, run(batch)):
        for node, row in zip(nodes_run, logits):
            node.logits = row


def _ancestors(nodes, i) -> list[int]:
    """Node i and its ancestors below the root, root side first."""
    out = []
    while i > 0:
        out.append(i)
        i = nodes[i].parent
    return out[::-1]


def _children(nodes, i, ranks, draw=None) -> None:
    """Add node i's children of the given ranks: its drafter's top-k, or with `draw` its first len(ranks)
    draws from q, in rank order."""
    drawn = draw(nodes[i].logits, len(ranks)) if draw is not None else None
    if drawn is not None:
        tokens, q = drawn
        nodes.extend(TreeNode(t, i, nodes[i].depth + 1, r, q=q) for t, r in zip(tokens, ranks))
        return
    logp = torch.log_softmax(nodes[i].logits.float(), -1)
    top = torch.topk(logp, max(ranks) + 1)
    for r in ranks:
        nodes.append(TreeNode(int(top.indices[r]), i, nodes[i].depth + 1, r, nodes[i].value + float(top.values[r])))


def _grow_static(trees, shape: TreeShape, run, draws):
    tree = shape.static
    for depth in range(1, tree.max_depth + 1):
        parents = sorted({tree.parents[i] for i in range(1, tree.num_nodes + 1) if tree.depths[i] == depth})
        _run(trees, [[p for p in parents if p > 0] for _ in trees], run)  # the root's logits are known
        for nodes, draw in zip(trees, draws):
            for p in parents:
                _children(nodes, p, [tree.ranks[c] for c in tree.children[p]], draw)
    return trees  # node i of each list is node i of the static tree (both breadth first, rank order)


def _grow_dynamic(trees, shape: TreeShape, run):
    for nodes in trees:
        _children(nodes, 0, list(range(shape.topk)))
    for depth in range(2, shape.num_steps + 1):
        frontier = []
        for nodes in trees:  # expand the topk most valuable nodes of the newest depth
            newest = [i for i, n in enumerate(nodes) if n.depth == depth - 1]
            frontier.append(sorted(newest, key=lambda i: (-nodes[i].value, i))[:shape.topk])
        _run(trees, frontier, run)
        for nodes, idx in zip(trees, frontier):
            for i in idx:
                _children(nodes, i, list(range(shape.topk)))
    out = []
    for nodes in trees:  # rerank: keep the most valuable nodes of the whole tree, then breadth first
        keep = sorted(range(1, len(nodes)), key=lambda i: (-nodes[i].value, nodes[i].depth, i))[:shape.num_nodes]
        order = [0] + sorted(keep, key=lambda i: (nodes[i].depth, i))
        new = {old: j for j, old in enumerate(order)}
        out.append([TreeNode(nodes[i].token, new[nodes[i].parent] if i else -1, nodes[i].depth, nodes[i].rank,
                             nodes[i].value) for i in order])
    return out


def _finish(nodes: list[TreeNode], shape: TreeShape) -> tuple:
    """Tokens of nodes 1..N, their TokenTree, and their q rows ((N, V), or None for top-k children)."""
    tokens = [n.token for n in nodes[1:]]
    if shape.static is not None:
        q = torch.stack([n.q for n in nodes[1:]]) if nodes[1].q is not None else None
        return tokens, shape.static, q
    return tokens, from_parents([n.parent for n in nodes], [n.rank for n in nodes]), None
