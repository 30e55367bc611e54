"""EAGLE proposer: a head drafts from the target's hidden states, in the step that produced them.

vLLM's `vllm/v1/spec_decode/eagle.py` flow (lesson 08). After the scheduler has committed a step,
the runner hands `propose` that step's target forward: the hidden states of every token the target
just ran (prefill chunks, decodes, drafts being verified). For every scheduled request still running,
with committed tokens x_0 .. x_{L-1} of which the target has now computed L - 1:

  1. first pass: one head forward over this forward's committed rows t (the rows of rejected drafts
     are dropped), with input (x_{t+1}, f_t): the shifted tokens, the newest x_{L-1} included
     (vLLM's `input_ids[:-1] = target_token_ids[1:]; input_ids[last] = next_token_ids`). A prefill
     chunk that did not sample still runs it, so the head's KV keeps up with the target's; for a
     request that sampled, its last row (t = L - 2) gives g and q for x_L: draft d_1;
  2. chain: k - 1 single-token steps at positions L - 1, L, ... with input (d_i, g), the head's own
     output feature fed back.

The head's KV lives in the *target's* block tables: its layer has its own cache tensors, addressed
by the same slot mapping. The chain writes positions up to L + k - 3, beyond the target's committed
tokens, into the `num_lookahead_tokens` = k slots the scheduler reserves (vLLM's lookahead);
after a rejection the head's stale entries sit where the target's do and are rewritten, from the
target's true features, by the next first pass before anything reads them. Preemption frees both,
and the head keeps no state of its own between steps.

Drafts are the argmax of q ("greedy", q treated as one-hot by the verifier, as vLLM does) or sampled
from q ("probabilistic", q kept: the rejection rule then needs it). Output stays exact either way.
"""

from __future__ import annotations

import torch

from speclab.engine.batch import TreeChunk, flatten
from speclab.engine.proposer import (SAMPLE_METHODS, Proposal, Proposer, ProposerContext, TargetForward,
                                     check_k, check_sample_method, draft_tokens)
from speclab.engine.request import Request
from speclab.models.heads import DEFAULT_HEADS, load_head
from speclab.models.smollm2 import NAMES as SMOLLM2
from speclab.proposers.tree_drafting import TreeShape, check_tree, draft_trees, draw_siblings, tree_mask

__all__ = ["SAMPLE_METHODS", "EagleProposer", "from_config", "load_head_for", "draft_tokens"]


class EagleProposer(Proposer):
    """Args:
        head: an EagleHead (or MTPHead) bound to the engine's target (speclab.models.heads.load_head).
        num_speculative_tokens: k.
        sample_method: "greedy" or "probabilistic".
        generator: stream for unseeded sampled drafts; None: the engine hands over its own.
    """

    def __init__(self, head, num_speculative_tokens: int, sample_method: str = "greedy",
                 generator: torch.Generator | None = None, tree: TreeShape | None = None):
        check_sample_method(sample_method)
        check_k(num_speculative_tokens)
        check_tree(tree, num_speculative_tokens, sample_method, head.cfg.draft_vocab_size or None)
        self.head = head
        self.tree = tree
        self.num_speculative_tokens = num_speculative_tokens
        # vLLM: k slots for the chain; a tree writes one slot per node it runs
        self.num_lookahead_tokens = max(num_speculative_tokens, tree.max_run) if tree else num_speculative_tokens
        self.hidden_layers = tuple(head.cfg.hidden_layers)
        self.sample_method = sample_method
        self.generator = generator
        self.kv = None
        self.cache = None

    def attach_kv(self, kv) -> None:
        self.kv = kv
        self.cache = self.head.allocate_kv_cache(kv.pool.num_blocks, kv.block_size)

    @torch.inference_mode()
    def propose(self, requests: list[Request], max_drafts: list[int],
                forward: TargetForward | None = None) -> list[Proposal]:
        if self.kv is None:
            raise RuntimeError("EagleProposer has no KV: the engine calls attach_kv (use LLMEngine or LLM)")
        if forward is None:
            raise RuntimeError("EagleProposer drafts from the target's hidden states: the runner passes this "
                               "step's forward (use LLMEngine or LLM)")
        g = self._first_pass(forward)  # request id -> g at its last committed row
        want = {r.request_id: k for r, k in zip(requests, max_drafts)}
        active = [r for r in requests if want[r.request_id] > 0 and r.request_id in g]
        drafts = {r.request_id: ([], []) for r in requests}
        if not active:
            return [Proposal([]) for _ in requests]
        g_active = torch.stack([g[r.request_id] for r in active])  # (B, d)
        if self.tree is not None:
            return self._propose_trees(requests, active, g_active)
        for step in range(max(want[r.request_id] for r in active)):
            toks, q = draft_tokens(active, self.head.logits(g_active), [len(r.output_token_ids) + step for r in active],
                                   self.sample_method, self.generator)
            for r, t, qi in zip(active, toks, q):
                drafts[r.request_id][0].append(t)
                drafts[r.request_id][1].append(qi)
            more = [j for j, r in enumerate(active) if want[r.request_id] > step + 1]
            if not more:
                break
            active = [active[j] for j in more]
            g_active = self._forward([(r.request_id, [toks[j]], r.num_computed_tokens + step)
                                      for j, r in zip(more, active)], g_active[more])
        return [self._proposal(*drafts[r.request_id]) for r in requests]

    def _propose_trees(self, requests, active, g_active) -> list[Proposal]:
        """A tree per request (lesson 10): each node run feeds (its token, its parent's g), at the position
        of its depth, into the lookahead slots after the committed tokens, seeing its ancestors only."""
        feats = [{-1: g} for g in g_active]  # per request: slot -> the g a node there produced (-1: the root)

        def run(batch):
            chunks, inputs = [], []
            for r, nodes, f in zip(active, batch, feats):
                if nodes:
                    base = r.num_computed_tokens  # the head's tree slots start where the target's stop
                    chunks.append((r.request_id, [n.token for n in nodes], base + nodes[0].slot,
                                   TreeChunk([base + n.depth - 1 for n in nodes], base, tree_mask(nodes))))
                    inputs += [f[n.sees[-2] if len(n.sees) > 1 else -1] for n in nodes]  # the parent's g
            input_ids, meta = flatten(self.kv, chunks, self.head.fc.weight.device)
            g = self.head(input_ids, torch.stack(inputs), meta, self.cache)
            out, rows = [], iter(g.split([len(c[1]) for c in chunks]))
            for nodes, f in zip(batch, feats):
                if not nodes:
                    out.append(None)
                    continue
                g_b = next(rows)
                f.update({n.slot: row for n, row in zip(nodes, g_b)})
                out.append(self.head.logits(g_b))
            return out

        vocab = self.head.d2t if self.head.cfg.draft_vocab_size else None  # the tokens its logits score
        draws = ([draw_siblings(r.params, self.generator, vocab) for r in active] if self.sample_method != "greedy"
                 else None)
        grown = dict(zip((r.request_id for r in active), draft_trees(self.head.logits(g_active), self.tree, run, draws)))
        return [Proposal(grown[r.request_id][0], grown[r.request_id][2], grown[r.request_id][1])
                if r.request_id in grown else Proposal([]) for r in requests]

    def _first_pass(self, forward: TargetForward) -> dict[str, torch.Tensor]:
        """The head over every running request's committed rows of this forward; its last g per request."""
        chunks, feats = [], []
        for b, r in enumerate(forward.requests):
            rows = forward.committed_rows(b)
            start = forward.starts[b]
            if r.is_finished or not len(rows) or r.num_tokens < start + 1 + len(rows):
                continue  # finished in this step, or nothing committed
            chunks.append((r.request_id, r.all_token_ids[start + 1:start + 1 + len(rows)], start))
            feats.append(self.head.features(rows))
        if not chunks:
            return {}
        g = self._forward(chunks, torch.cat(feats))  # (len(chunks), d): last rows
        return {rid: row for (rid, _, _), row in zip(chunks, g)}

    def _proposal(self, tokens: list[int], qs: list) -> Proposal:
        return Proposal(tokens, None if self.sample_method == "greedy" or not tokens else torch.stack(qs))

    def _forward(self, chunks, feature: torch.Tensor) -> torch.Tensor:
        """One head forward over (request id, tokens, first position) chunks; each chunk's last g."""
        input_ids, meta = flatten(self.kv, chunks, self.head.fc.weight.device)
        g = self.head(input_ids, feature, meta, self.cache)
        return g[torch.tensor(meta.query_start_loc[1:]) - 1]


def load_head_for(spec, context: ProposerContext):
    """The head a head method drafts with: spec.model (a directory or a shipped name), or, when it is
    None, the head speclab ships for this target; checked against the target and the method. It runs in
    the config's `draft_dtype` (default: the target's)."""
    name = spec.model
    if name is None:
        target = context.target_name
        shipped = DEFAULT_HEADS.get("smollm2" if target in SMOLLM2 else "target" if target in (None, "target") else "")
        if not shipped or spec.method not in shipped:
            raise ValueError(f"method {spec.method!r} needs a head 'model' for this target (speclab ships "
                             f"{DEFAULT_HEADS}): train one with python -m speclab.train.heads")
        name = shipped[spec.method]
    return load_head(name, context.target, dtype=context.draft_dtype(spec), method=spec.method)


def from_config(spec, context: ProposerContext) -> EagleProposer:
    """`method: "eagle"` / `"eagle3"` (the registry's constructor)."""
    return EagleProposer(load_head_for(spec, context), spec.num_speculative_tokens,
                         sample_method=spec.draft_sample_method, tree=TreeShape.from_config(spec))
