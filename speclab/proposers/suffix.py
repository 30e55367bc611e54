"""Suffix decoding (vLLM's `method: "suffix"`): draft what followed this context before, in this
request or in the engine's earlier outputs, scored by how often it followed.

Oliaro, Jia, Campos & Qiao, "SuffixDecoding: Extreme Speculative Decoding for Emerging AI
Applications" (NeurIPS 2025, arXiv 2411.04975; Snowflake's Arctic Inference, which vLLM calls).
Two suffix structures, each a suffix tree cut at depth `max_tree_depth` (a trie of every substring
of at most that many tokens, each node counting its occurrences):

- per request, over its prompt and output so far (what prompt lookup searches too);
- global, over the outputs of the engine's requests, the last `max_cached_requests` of them
  (oldest evicted first): what makes a repeated or near-repeated request cheap (agents retrying,
  multi-turn edits, templated answers), and what prompt lookup cannot see.

Each step, for every match length m (the last m context tokens found as a path in a tree), the draft
is grown greedily from the match: the most frequent next token, then its most frequent next token,
..., while the product of the empirical next-token frequencies stays >= `min_token_prob`, and for
at most max_spec_factor * m tokens (a short match earns a short draft: the adaptive length). A
draft's score is the sum of those products (its expected accepted tokens if the frequencies were
the target's law); the best score over both trees and all match lengths wins. The drafts are
one-hot (`draft_probs=None`): verification is exact with any rule, like n-gram drafts.

vLLM verifies suffix drafts as a chain (Arctic's `use_tree_spec` off); so does speclab.
"""

from collections import OrderedDict

from speclab.engine.proposer import Proposal, Proposer
from speclab.engine.request import Request

# vLLM's defaults for its suffix_decoding_* keys
MAX_TREE_DEPTH = 24
MAX_CACHED_REQUESTS = 10_000
MAX_SPEC_FACTOR = 1.0
MIN_TOKEN_PROB = 0.1


class _Node:
    __slots__ = ("children", "count")

    def __init__(self):
        self.children: dict[int, _Node] = {}
        self.count = 0  # occurrences of the path from the root to here


class _Sequence:
    """One sequence inserted into a SuffixTree: its tokens and the nodes of its current suffixes."""
    __slots__ = ("tokens", "active")

    def __init__(self):
        self.tokens: list[int] = []
        self.active: list[_Node] = []  # active[j]: the node of the sequence's last j + 1 tokens


class SuffixTree:
    """Every substring of up to `max_depth` tokens of the inserted sequences, with counts.

    Appending a token to a sequence extends each of its last max_depth - 1 suffixes by one node
    (O(max_depth) per token); removing a sequence walks its substrings again and decrements.
    """

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _Node()
        self.sequences: dict[str, _Sequence] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.sequences

    def __len__(self) -> int:
        return len(self.sequences)

    def extend(self, key: str, tokens) -> None:
        """Append `tokens` to sequence `key` (a new one when unseen)."""
        seq = self.sequences.setdefault(key, _Sequence())
        D = self.max_depth
        for t in tokens:
            t = int(t)
            new_active = []
            for node in ([self.root] + seq.active)[:D]:  # suffixes of length 0..D-1 grow by t
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                child.count += 1
                new_active.append(child)
            seq.active = new_active[:D - 1]  # a depth-D node is never extended
            seq.tokens.append(t)

    def remove(self, key: str) -> None:
        """Take sequence `key` out: every substring it added loses one count (empty nodes go)."""
        tokens = self.sequences.pop(key).tokens
        for i in range(len(tokens)):
            node = self.root
            for t in tokens[i:i + self.max_depth]:
                child = node.children[t]
                child.count -= 1
                if child.count == 0:
                    del node.children[t]  # its whole subtree came from this sequence alone
                    break
                node = child

    def find(self, pattern) -> _Node | None:
        """The node of `pattern` (a path from the root), or None where it never occurred."""
        node = self.root
        for t in pattern:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def speculate(self, context, max_tokens: int, max_spec_factor: float,
                  min_token_prob: float) -> tuple[list[int], float]:
        """The best-scoring draft after `context` over all match lengths: (tokens, score)."""
        best, best_score = [], 0.0
        n = len(context)
        for m in range(1, min(n, self.max_depth - 1) + 1):
            node = self.find(context[n - m:])
            if node is None:
                break  # a longer suffix contains this one: it cannot occur either
            limit = min(max_tokens, int(max_spec_factor * m + 1e-9), self.max_depth - m)
            draft, score = _grow(node, limit, min_token_prob)
            if draft and score >= best_score:  # ties: the longer match, the more specific context
                best, best_score = draft, score
        return best, best_score


def _grow(node: _Node, limit: int, min_token_prob: float) -> tuple[list[int], float]:
    """Follow the most frequent child while the running product of frequencies >= min_token_prob."""
    draft, prob, score = [], 1.0, 0.0
    while len(draft) < limit and node.children:
        total = sum(c.count for c in node.children.values())  # continuations seen (not the open end)
        t, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))  # ties: smaller id
        prob *= child.count / total
        if prob < min_token_prob:
            break
        draft.append(t)
        score += prob
        node = child
    return draft, score


class SuffixProposer(Proposer):
    """Args (vLLM's `suffix_decoding_*` keys):
        num_speculative_tokens: k, the most drafts per step.
        max_tree_depth: longest substring stored, and so longest match plus draft (24).
        max_cached_requests: outputs kept in the global tree, oldest evicted first; 0 = no global tree (10000).
        max_spec_factor: a match of m tokens drafts at most max_spec_factor * m tokens (1.0).
        min_token_prob: stop a draft when the product of its frequencies falls below this (0.1).
    """

    def __init__(self, num_speculative_tokens: int, max_tree_depth: int = MAX_TREE_DEPTH,
                 max_cached_requests: int = MAX_CACHED_REQUESTS, max_spec_factor: float = MAX_SPEC_FACTOR,
                 min_token_prob: float = MIN_TOKEN_PROB):
        check_knobs(num_speculative_tokens, max_tree_depth, max_cached_requests, max_spec_factor, min_token_prob)
        self.num_speculative_tokens = num_speculative_tokens
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.local: dict[str, SuffixTree] = {}  # request id -> its tree over prompt + output
        self.global_tree = SuffixTree(max_tree_depth)  # outputs of this engine's requests
        self._cached: OrderedDict[str, None] = OrderedDict()  # request ids in global_tree, oldest first
        self._seen: dict[str, Request] = {}  # running requests drafted for: at `remove`, a finished one's
        # last step of tokens (committed after its last proposal) still joins the global tree

    def propose(self, requests: list[Request], max_drafts: list[int], forward=None) -> list[Proposal]:
        """Drafts for each request from its committed tokens (`forward`, the target's hidden states, is not read)."""
        return [self._propose_one(r, k) for r, k in zip(requests, max_drafts)]

    def _propose_one(self, r: Request, k: int) -> Proposal:
        self._seen[r.request_id] = r
        tree = self._local_tree(r)
        self._cache_output(r)
        k = min(k, self.num_speculative_tokens)
        if k <= 0:
            return Proposal([])
        context = r.all_token_ids[-(self.max_tree_depth - 1):]
        args = (context, k, self.max_spec_factor, self.min_token_prob)
        draft, score = tree.speculate(*args)
        if self.max_cached_requests:
            other, other_score = self.global_tree.speculate(*args)
            if other_score > score:
                draft = other
        return Proposal(draft)

    def _local_tree(self, r: Request) -> SuffixTree:
        """The request's tree, brought up to its committed tokens (built on first sight)."""
        tree = self.local.get(r.request_id)
        if tree is None:
            tree = self.local[r.request_id] = SuffixTree(self.max_tree_depth)
        seen = len(tree.sequences[r.request_id].tokens) if r.request_id in tree else 0
        if seen < r.num_tokens:
            tree.extend(r.request_id, r.all_token_ids[seen:])
        return tree

    def _cache_output(self, r: Request) -> None:
        """Add the request's new output tokens to the global tree; evict the oldest outputs past the bound."""
        if not self.max_cached_requests:
            return
        rid = r.request_id
        seen = len(self.global_tree.sequences[rid].tokens) if rid in self.global_tree else 0
        if seen < len(r.output_token_ids):
            self.global_tree.extend(rid, r.output_token_ids[seen:])
            self._cached.setdefault(rid, None)
        while len(self._cached) > self.max_cached_requests:
            oldest, _ = self._cached.popitem(last=False)
            self.global_tree.remove(oldest)

    def remove(self, request_ids: list[str]) -> None:
        """Drop the requests' own trees; their outputs stay in the global tree until evicted (a finished
        request's whole output: its last step's tokens are added here).

        A preempted request that comes back under the same id continues its global sequence."""
        for rid in request_ids:
            self.local.pop(rid, None)
            r = self._seen.pop(rid, None)
            if r is not None and r.is_finished:
                self._cache_output(r)


def check_knobs(k, depth, cached, factor, min_prob) -> None:
    """ValueError naming the suffix_decoding_* key unless every knob is in range (vLLM's checks)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"num_speculative_tokens must be an integer > 0, got {k!r}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 2:
        raise ValueError(f"suffix_decoding_max_tree_depth must be an integer >= 2 (a match and one draft), "
                         f"got {depth!r} (vLLM's default: {MAX_TREE_DEPTH})")
    if isinstance(cached, bool) or not isinstance(cached, int) or cached < 0:
        raise ValueError(f"suffix_decoding_max_cached_requests must be an integer >= 0 (0 turns the global "
                         f"cache off), got {cached!r} (vLLM's default: {MAX_CACHED_REQUESTS})")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise ValueError(f"suffix_decoding_max_spec_factor must be > 0, got {factor!r} (vLLM's default: "
                         f"{MAX_SPEC_FACTOR}: a match of m tokens drafts at most m)")
    if not isinstance(min_prob, (int, float)) or isinstance(min_prob, bool) or not 0 <= min_prob <= 1:
        raise ValueError(f"suffix_decoding_min_token_prob must be in [0, 1], got {min_prob!r} "
                         f"(vLLM's default: {MIN_TOKEN_PROB})")


def from_config(spec, context=None) -> SuffixProposer:
    """`method: "suffix"` (the registry's constructor): the suffix_decoding_* keys of the speculative
    config (vLLM's names and defaults); the target is not needed."""
    return SuffixProposer(spec.num_speculative_tokens, max_tree_depth=spec.suffix_decoding_max_tree_depth,
                          max_cached_requests=spec.suffix_decoding_max_cached_requests,
                          max_spec_factor=spec.suffix_decoding_max_spec_factor,
                          min_token_prob=spec.suffix_decoding_min_token_prob)
