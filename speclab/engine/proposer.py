"""The proposer protocol: what the engine needs from anything that drafts tokens.

It lives with the engine, and proposers (speclab/proposers/) depend on it, never the reverse:
the runner does not know which proposer it drives. After the scheduler has committed a step's
tokens, the runner hands the proposer the requests that were scheduled, sampled and are still
running, and gets back, per request, up to k draft tokens (and, for a probabilistic drafter, the
draft distributions q they were sampled from). A stateful proposer (a draft model with its own KV
cache) reconciles its state with the request's committed tokens inside `propose`, and drops it
when the runner calls `remove` for a preempted, finished or aborted request.
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
    """Base class: override `propose`; `remove` is a no-op for stateless proposers.

    Attributes:
        num_speculative_tokens: k, the most drafts per request and step.
    """

    num_speculative_tokens: int = 0

    def propose(self, requests: list[Request], max_drafts: list[int]) -> list[Proposal]:
        """Draft up to max_drafts[i] (<= k) tokens for each request, given its committed tokens."""
        raise NotImplementedError

    def remove(self, request_ids: list[str]) -> None:
        """Forget these requests: preempted (the target's cache of them is gone), finished or aborted."""
