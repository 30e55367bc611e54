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

from speclab.engine.proposer import Proposal, Proposer, TargetForward
from speclab.engine.request import Request
from speclab.proposers.eagle import SAMPLE_METHODS, draft_tokens


class MedusaProposer(Proposer):
    """Args:
        head: a MedusaHead bound to the engine's target.
        num_speculative_tokens: k <= the head's num_heads.
        sample_method: "greedy" or "probabilistic".
        generator: stream for unseeded sampled drafts; None: the engine hands over its own.
    """

    def __init__(self, head, num_speculative_tokens: int, sample_method: str = "greedy",
                 generator: torch.Generator | None = None):
        if sample_method not in SAMPLE_METHODS:
            raise ValueError(f"sample_method must be one of {SAMPLE_METHODS}, got {sample_method!r}")
        if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
                or not 1 <= num_speculative_tokens <= head.cfg.num_heads:
            raise ValueError(f"num_speculative_tokens={num_speculative_tokens!r}: this Medusa head has "
                             f"{head.cfg.num_heads} heads, one draft each; ask for 1..{head.cfg.num_heads}")
        self.head = head
        self.num_speculative_tokens = num_speculative_tokens
        self.hidden_layers = tuple(head.cfg.hidden_layers)
        self.sample_method = sample_method
        self.generator = generator
        self.last: dict[str, tuple[int, torch.Tensor]] = {}  # request id -> (first position, rows of its last forward)

    def observe(self, forward: TargetForward) -> None:
        q = forward.query_start_loc
        for b, (rid, start) in enumerate(zip(forward.request_ids, forward.starts)):
            self.last[rid] = (start, forward.hidden[q[b]:q[b + 1]])

    def remove(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.last.pop(rid, None)

    @torch.inference_mode()
    def propose(self, requests: list[Request], max_drafts: list[int]) -> list[Proposal]:
        idx, rows = [], []
        for i, (r, k) in enumerate(zip(requests, max_drafts)):
            start, h = self.last.pop(r.request_id, (0, None))
            t = r.num_computed_tokens - 1 - start  # the row that produced the newest token
            if k > 0 and h is not None and 0 <= t < len(h):
                idx.append(i)
                rows.append(h[t])
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
