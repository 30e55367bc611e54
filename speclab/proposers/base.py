"""The proposer protocol: what the engine needs from anything that drafts tokens.

The runner does not know which proposer it drives. After each step it hands the proposer the
requests that are decoding, and gets back, per request, up to k draft tokens (and, for a
probabilistic drafter, the draft distributions q they were sampled from). Stateful proposers (a
draft model with its own KV cache) also hear when a request's committed tokens change or end.
"""

from dataclasses import dataclass

import torch

from speclab.engine.request import Request


@dataclass
class Proposal:
    """Drafts for one request. draft_probs: (len(token_ids), V) q rows, or None for one-hot drafts."""

    token_ids: list[int]
    draft_probs: torch.Tensor | None = None


class Proposer:
    """Base class: override `propose`; the hooks are no-ops for stateless proposers.

    Attributes:
        num_speculative_tokens: k, the most drafts per request and step.
    """

    num_speculative_tokens: int = 0

    def propose(self, requests: list[Request], max_drafts: list[int]) -> list[Proposal]:
        """Draft up to max_drafts[i] (<= k) tokens for each request, given its committed tokens."""
        raise NotImplementedError

    def on_verified(self, request: Request, num_draft_tokens: int, num_accepted: int) -> None:
        """Called after verification, before the new tokens are appended."""

    def on_reset(self, request: Request) -> None:
        """The request was preempted (its caches are gone) or finished."""
