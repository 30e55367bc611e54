"""The proposer protocol: what the engine needs from anything that drafts tokens.

It lives with the engine, and proposers (speclab/proposers/) depend on it, never the reverse:
the runner does not know which proposer it drives. After the scheduler has committed a step's
tokens, the runner hands the proposer the requests that were scheduled, sampled and are still
running, and gets back, per request, up to k draft tokens (and, for a probabilistic drafter, the
draft distributions q they were sampled from). A stateful proposer (a draft model with its own KV
cache) reconciles its state with the request's committed tokens inside `propose`, and drops it
when the runner calls `remove` for a preempted, finished or aborted request.

A head on the target's hidden states (EAGLE, MTP, Medusa; lesson 08) declares two things more:
`hidden_layers`, the target layers whose outputs it reads (the runner asks the target forward for
them and hands them over through `observe`, right after the forward), and `num_lookahead_tokens`,
the slots per decoding request it writes into the *target's* block tables after the forward (the
engine reserves them, and gives it the target's block bookkeeping through `attach_kv`).
"""

from dataclasses import dataclass

import torch

from speclab.engine.request import Request


@dataclass
class Proposal:
    """Drafts for one request. draft_probs: (len(token_ids), V) q rows, or None for one-hot drafts."""

    token_ids: list[int]
    draft_probs: torch.Tensor | None = None


@dataclass
class TargetForward:
    """What one target forward computed, for a proposer that reads hidden states.

    Attributes:
        request_ids: the scheduled requests, in batch order.
        starts: position of each request's first new token.
        query_start_loc: (B + 1,) request b's rows are [query_start_loc[b], query_start_loc[b+1]).
        hidden: (N, n * D) the outputs of the proposer's `hidden_layers`, concatenated per row.
    """

    request_ids: list[str]
    starts: list[int]
    query_start_loc: list[int]
    hidden: torch.Tensor


class Proposer:
    """Base class: override `propose`; `remove` is a no-op for stateless proposers.

    Attributes:
        num_speculative_tokens: k, the most drafts per request and step.
        hidden_layers: target layers whose outputs `observe` receives (0 = embeddings, i = after
            layer i; the last layer's is taken before the final norm); () = none, no `observe`.
        num_lookahead_tokens: slots per decoding request written into the target's block tables.
    """

    num_speculative_tokens: int = 0
    hidden_layers: tuple[int, ...] = ()
    num_lookahead_tokens: int = 0

    def propose(self, requests: list[Request], max_drafts: list[int]) -> list[Proposal]:
        """Draft up to max_drafts[i] (<= k) tokens for each request, given its committed tokens."""
        raise NotImplementedError

    def remove(self, request_ids: list[str]) -> None:
        """Forget these requests: preempted (the target's cache of them is gone), finished or aborted."""

    def attach_kv(self, kv) -> None:
        """Called once by the engine when num_lookahead_tokens > 0: the target's KVCacheManager,
        whose block tables address the proposer's own cache tensors too."""

    def observe(self, forward: TargetForward) -> None:
        """Called by the runner right after each target forward (only when hidden_layers is set),
        before verification: rows of rejected drafts are among them; `propose` knows which to keep."""
