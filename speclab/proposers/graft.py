"""A lookup's draft grafted into a model drafter's tree (speclab's `graft_method`; lesson 10).

A model drafter (EAGLE, the draft model) and a lookup (prompt lookup, suffix decoding) are right in
different places. The head guesses the next token from meaning and is seldom right twice in a row; a
lookup copies what followed the same words earlier in the context, and when the answer repeats the
prompt (a summary quoting its source, an edit rewriting code) it is right for several tokens at once.
A tree can hold both in one verify step: the drafter's tree, and the lookup's chain of m tokens as one
more branch. Where the chain starts with a token the tree already has, it continues under that node
instead, so it costs only the tokens the tree does not have. The step verifies the tree's N nodes plus
at most m, and keeps whichever path the target agrees with longest.

Every node is a point mass (the drafter's top-k and the lookup's copies alike), so the verifier's walk
(`speclab.verify.tree.sample_tree`) is exact whatever the tree holds, at any temperature; a grafted
chain can only change how many tokens a step keeps. Arctic Inference combines suffix decoding with its
model drafters too, but by choosing one of the two drafts each step from their scores; a graft keeps
both and lets the verifier choose, which costs verified tokens: on a 2-core Zen 4 a float32 forward over 7
tokens cost 1.1-1.4 decode steps where one over 4 cost about 1.0 (`bench heads`' v_6 and v_3, 2026-12-07).

    LLM("smollm2", speculative_config={"method": "eagle", "speculative_token_tree": "[(0,), (1,), (2,)]",
                                       "num_speculative_tokens": 6, "graft_method": "ngram",
                                       "prompt_lookup_min": 2, "prompt_lookup_max": 3})

`num_speculative_tokens` stays the verified budget: the tree's nodes plus the m = 6 - 3 lookup tokens.
"""

from __future__ import annotations

import torch

from speclab.engine.proposer import Proposal, Proposer
from speclab.engine.request import Request
from speclab.verify.tree import TokenTree, chain, from_parents

__all__ = ["GRAFT_TOKENS", "NGRAM_GRAFT", "GraftedProposer", "graft"]

# What `make demo` and `bench heads` graft: an n-gram chain of up to 3 tokens, found by a match of 3 or 2 tokens.
# The length was chosen by replaying EAGLE's 3-star at every position of plain greedy decoding on SmolLM2 (12
# held-out chats per set x 48 tokens, 2026-12-07, a Zen 4 EPYC; the replay's tau matched the engine's within 2 %)
# and pricing each step with `bench verify-cost`'s cost of a forward over n tokens: grafting 2, 3 or 4 tokens gave
# tau 2.55 / 3.09 / 3.38 on edit and 1.55 / 1.57 / 1.57 on chat (the 3-star alone: 1.74 and 1.46); priced, 3 was
# the best on qa, level with 2 on chat, and 2 % behind 4 on edit and codegen.
# The 2-token match: on that Zen 4 grafting only after one priced within 2 % of grafting after any 1-token match.
# On a Zen 5 EPYC, whose 6th and 7th rows cost far more (7 rows 1.5-1.7 decode steps, 5 rows 1.0), it won: a
# 1-token match is found at almost every step, so every step paid for 7 rows. In two interleaved runs there (4
# chats per set x 48 tokens x 3 rounds, the rows in opposite orders, 2026-12-07 19:13-19:21 UTC) the decode phase
# with 3 tokens read 2.39 / 1.85 / 1.53x (edit / qa / chat) and 2.01 / 1.93 / 1.73 / 1.51x (edit / codegen / qa /
# chat) after a 2-token match against 2.24 / 1.61 / 1.48x and 2.31 / 1.94 / 1.62 / 1.40x after any match: qa +7-15 %,
# chat +3-8 %, edit and codegen level (tau 3.32 against 3.38 on edit; MEASUREMENTS.md, "The Zen 5, later"). Three
# tokens against two after a 2-token match (6 chats per set, decode phase): 1.81-1.93 against 1.68-1.74x on edit,
# 1.80-1.87 against 1.68-1.73 on codegen, level on qa and chat.
GRAFT_TOKENS = 3
NGRAM_GRAFT = {"graft_method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 3}


def graft(tokens: list[int], tree: TokenTree | None, lookup: list[int]) -> tuple[list[int], TokenTree]:
    """The tree (nodes 1..N = tokens; None: a chain of them) with the lookup's chain added from the root.

    The chain follows the tree as long as the tree already holds its tokens (the same token under the
    same parent), then continues as new nodes, each the last child of its parent. Returns the tokens of
    the nodes 1..N' and their tree, breadth first: the tree's nodes keep their order within a depth and
    the new ones follow them, so a prefix is still a tree (what a step with a smaller budget verifies)."""
    tree = chain(len(tokens)) if tree is None else tree
    if len(tokens) != tree.num_nodes:
        raise ValueError(f"{len(tokens)} tokens for a tree of {tree.num_nodes} nodes")
    parents, ranks, toks = list(tree.parents), list(tree.ranks), [None] + list(tokens)
    children = [list(c) for c in tree.children]
    at = 0  # the node the chain has reached
    for t in lookup:
        same = next((c for c in children[at] if toks[c] == t), None)
        if same is None:  # a new node: the parent's last child
            parents.append(at)
            ranks.append(len(children[at]))
            toks.append(t)
            children.append([])
            children[at].append(len(parents) - 1)
            same = len(parents) - 1
        at = same
    if len(parents) == len(tree.parents):
        return list(tokens), tree
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    order = [0] + sorted(range(1, len(parents)), key=lambda i: depths[i])  # stable: the tree's order kept
    new_index = {old: new for new, old in enumerate(order)}
    return ([toks[i] for i in order[1:]],
            from_parents([-1] + [new_index[parents[i]] for i in order[1:]], [ranks[i] for i in order]))


class GraftedProposer(Proposer):
    """Args:
        drafter: a model drafter that drafts trees (one-hot drafts: `draft_probs` None).
        lookup: a proposer that drafts chains from the context (ngram, suffix), k = the m tokens grafted.

    The engine sees one proposer: k = the drafter's k (its tree's nodes) + the lookup's; the drafter's
    hidden layers, lookahead slots, cache and stream.
    """

    def __init__(self, drafter: Proposer, lookup: Proposer):
        if lookup.hidden_layers:
            raise ValueError("the grafted lookup drafts from tokens: it reads no hidden states")
        if getattr(drafter, "sample_method", "greedy") != "greedy":
            raise ValueError("a graft needs one-hot drafts: the drafter must draft greedily (its tree's top-k), "
                             "draft_sample_method 'greedy'")
        self.drafter, self.lookup = drafter, lookup
        self.num_speculative_tokens = drafter.num_speculative_tokens + lookup.num_speculative_tokens
        self.hidden_layers = drafter.hidden_layers
        self.num_lookahead_tokens = drafter.num_lookahead_tokens

    @property
    def generator(self) -> torch.Generator | None:
        return self.drafter.generator

    @generator.setter
    def generator(self, g: torch.Generator | None) -> None:
        self.drafter.generator = g

    def attach_kv(self, kv) -> None:
        self.drafter.attach_kv(kv)

    def propose(self, requests: list[Request], max_drafts: list[int], forward=None) -> list[Proposal]:
        mine = self.drafter.num_speculative_tokens
        drafts = self.drafter.propose(requests, [min(k, mine) for k in max_drafts], forward=forward)
        lookups = self.lookup.propose(requests, [min(k, self.lookup.num_speculative_tokens) for k in max_drafts])
        out = []
        for d, c, k in zip(drafts, lookups, max_drafts):
            if d.draft_probs is not None:
                raise ValueError("a graft needs one-hot drafts: the drafter must draft greedily (a tree does)")
            if k <= 0 or not c.token_ids:
                out.append(d)
                continue
            tokens, tree = graft(list(d.token_ids), d.tree, list(c.token_ids))
            out.append(Proposal(tokens, None, tree))
        return out

    def remove(self, request_ids: list[str]) -> None:
        self.drafter.remove(request_ids)
        self.lookup.remove(request_ids)
