"""Medusa proposer: k parallel heads read the target's last hidden state, one draft each.

vLLM's `vllm/v1/spec_decode/medusa.py`: drafts are [argmax(head_i(h))] from the hidden state of the
position that produced the newest token, all from one pass, with no KV cache and no lookahead slots
(Cai et al. 2024). Head i guesses x_{L-1+i} from h_{L-2} without seeing x_{L-1}, the token sampled
from that very row: the price of having no recurrence (compare EAGLE's shifted-token input).

Drafts are the argmax of each head ("greedy") or sampled from its q ("probabilistic", q kept):
each head's q is a distribution given the committed prefix, so the rejection rule stays exact.
"""

from __future__ import annotations

import torch

from speclab.engine.proposer import (Proposal, Proposer, ProposerContext, TargetForward, check_k, check_sample_method,
                                     draft_tokens)
from speclab.engine.request import Request
from speclab.proposers.eagle import load_head_for


class MedusaProposer(Proposer):
    """Args:
        head: a MedusaHead bound to the engine's target.
        num_speculative_tokens: k <= the head's num_heads.
        sample_method: "greedy" or "probabilistic".
        generator: stream for unseeded sampled drafts; None: the engine hands over its own.
    """

    def __init__(self, head, num_speculative_tokens: int, sample_method: str = "greedy",
                 generator: torch.Generator | None = None):
        check_sample_method(sample_method)
        try:
            check_k(num_speculative_tokens, head.cfg.num_heads)
        except ValueError as err:
            raise ValueError(f"{err}: this Medusa head has {head.cfg.num_heads} heads, one draft each") from None
        self.head = head
        self.num_speculative_tokens = num_speculative_tokens
        self.hidden_layers = tuple(head.cfg.hidden_layers)
        self.sample_method = sample_method
        self.generator = generator

    @torch.inference_mode()
    def propose(self, requests: list[Request], max_drafts: list[int],
                forward: TargetForward | None = None) -> list[Proposal]:
        if forward is None:
            raise RuntimeError("MedusaProposer drafts from the target's hidden states: the runner passes this "
                               "step's forward (use LLMEngine or LLM)")
        row_of = {r.request_id: b for b, r in enumerate(forward.requests)}
        idx, rows = [], []
        for i, (r, k) in enumerate(zip(requests, max_drafts)):
            h = forward.committed_rows(row_of[r.request_id]) if r.request_id in row_of else None
            if k > 0 and h is not None and len(h):
                idx.append(i)
                rows.append(h[-1])  # the row that produced the newest token
        out = [Proposal([]) for _ in requests]
        if not idx:
            return out
        kmax = max(max_drafts[i] for i in idx)
        logits = self.head(torch.stack(rows), kmax)  # (kmax, B, V)
        drafts = {i: ([], []) for i in idx}
        for j in range(kmax):
            reqs = [requests[i] for i in idx]
            toks, qs = draft_tokens(reqs, logits[j], [len(r.output_token_ids) + j for r in reqs],
                                    self.sample_method, self.generator)
            for i, t, q in zip(idx, toks, qs):
                if j < max_drafts[i]:
                    drafts[i][0].append(t)
                    drafts[i][1].append(q)
        for i, (toks, qs) in drafts.items():
            out[i] = Proposal(toks, None if self.sample_method == "greedy" else torch.stack(qs))
        return out


def from_config(spec, context: ProposerContext) -> MedusaProposer:
    """`method: "medusa"` (the registry's constructor)."""
    return MedusaProposer(load_head_for(spec, context), spec.num_speculative_tokens,
                          sample_method=spec.draft_sample_method)
