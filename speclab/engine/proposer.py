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
them and hands them to `propose` in the same step, as vLLM's `propose(target_hidden_states, ...)`),
and `num_lookahead_tokens`, the slots per decoding request it writes into the *target's* block
tables after the forward (the engine reserves them, and gives it the target's block bookkeeping
through `attach_kv`).

Randomness, said in code: a proposer that samples its drafts draws them with `draft_tokens`, which
uses the engine's own stream (`generator`, handed over by the engine) for unseeded requests, and for
a seeded request the noise keyed by (seed, output position) that the runner samples the target with
(Gumbel coupling): a second stream seeded alike would correlate drafts with the verifier's uniforms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speclab.engine.request import Request
from speclab.sampling import keyed_sample, logits_to_probs, sample_cdf

SAMPLE_METHODS = ("greedy", "probabilistic")  # draft_sample_method: argmax drafts, or drafts sampled from q


@dataclass
class Proposal:
    """Drafts for one request. draft_probs: (len(token_ids), V) q rows, or None for one-hot drafts;
    tree: their shape when they form a tree (speclab.verify.tree.TokenTree, node i + 1 = token_ids[i])."""

    token_ids: list[int]
    draft_probs: torch.Tensor | None = None
    tree: object = None


@dataclass
class TargetForward:
    """What one target forward computed, handed to a proposer that reads hidden states.

    Attributes:
        requests: the scheduled requests, in batch order (already updated by the scheduler's commit:
            `num_computed_tokens` tells how many of a request's rows were committed).
        starts: position of each request's first new token.
        query_start_loc: (B + 1,) request b's rows are [query_start_loc[b], query_start_loc[b+1]).
        hidden: (N, n * D) the outputs of the proposer's `hidden_layers`, concatenated per row.
        paths: for a request b that verified a tree (lesson 10), its committed rows among its own: the
            root's (0) and the accepted nodes', in path order; None or absent for a chain.
    """

    requests: list[Request]
    starts: list[int]
    query_start_loc: list[int]
    hidden: torch.Tensor
    paths: dict[int, list[int]] | None = None

    def committed_rows(self, b: int) -> torch.Tensor:
        """(n, n * D) request b's rows whose tokens the scheduler kept (rejected drafts' rows dropped)."""
        q, r = self.query_start_loc, self.requests[b]
        n = max(0, min(r.num_computed_tokens - self.starts[b], q[b + 1] - q[b]))
        if self.paths and b in self.paths:
            return self.hidden[torch.tensor(self.paths[b][:n], dtype=torch.long) + q[b]]
        return self.hidden[q[b]:q[b] + n]


@dataclass
class ProposerContext:
    """What the front end (`LLM`) hands a proposer's constructor besides the speculative config.

    Attributes:
        target: the target model (speclab's Llama forward).
        target_name: the name or directory the user gave for the target (None: the embedded target).
        tokenizer: the target's tokenizer.
        dtype, device: the target's.
        block_size, num_kv_blocks, max_num_seqs: the target's paged cache and batch limits.
    """

    target: torch.nn.Module
    target_name: object
    tokenizer: object
    dtype: torch.dtype
    device: str
    block_size: int
    num_kv_blocks: int
    max_num_seqs: int

    def draft_dtype(self, spec) -> torch.dtype:
        """The dtype a model drafter runs in: the speculative config's `draft_dtype` (speclab's key),
        else the target's."""
        return getattr(torch, spec.draft_dtype) if spec.draft_dtype else self.dtype


class Proposer:
    """Base class: override `propose`; `remove` is a no-op for stateless proposers.

    Attributes:
        num_speculative_tokens: k, the most drafts per request and step (the speculative config's).
        hidden_layers: target layers whose outputs `propose` receives in `forward` (0 = embeddings,
            i = after layer i; the last layer's is taken before the final norm); () = none.
        num_lookahead_tokens: slots per decoding request written into the target's block tables.
        generator: the stream for unseeded sampled drafts; None until the engine hands over its own.
    """

    num_speculative_tokens: int = 0
    hidden_layers: tuple[int, ...] = ()
    num_lookahead_tokens: int = 0
    generator: torch.Generator | None = None

    def propose(self, requests: list[Request], max_drafts: list[int],
                forward: TargetForward | None = None) -> list[Proposal]:
        """Draft up to max_drafts[i] (<= k) tokens for each request, given its committed tokens.

        `forward` is this step's target forward when `hidden_layers` is set (None otherwise): its
        requests include those that did not sample (a prefill chunk), whose rows a head still reads.
        """
        raise NotImplementedError

    def remove(self, request_ids: list[str]) -> None:
        """Forget these requests: preempted (the target's cache of them is gone), finished or aborted."""

    def attach_kv(self, kv) -> None:
        """Called once by the engine when num_lookahead_tokens > 0: the target's KVCacheManager,
        whose block tables address the proposer's own cache tensors too."""


def check_k(num_speculative_tokens, most: int | None = None) -> None:
    """ValueError unless k is an integer in 1..most (a proposer's constructor calls it)."""
    k = num_speculative_tokens
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or (most is not None and k > most):
        upto = f"1..{most}" if most is not None else "an integer > 0"
        raise ValueError(f"num_speculative_tokens must be {upto}, got {k!r}")


def check_sample_method(sample_method: str) -> None:
    if sample_method not in SAMPLE_METHODS:
        raise ValueError(f"sample_method must be one of {SAMPLE_METHODS}, got {sample_method!r}")


def draft_tokens(requests: list[Request], logits: torch.Tensor, positions: list[int], sample_method: str,
                 generator: torch.Generator | None) -> tuple[list[int], list[torch.Tensor | None]]:
    """One draft per row of `logits` (B, V) and its q row (None for "greedy").

    "greedy": the argmax (q is then treated as one-hot by the verifier, as vLLM does).
    "probabilistic": q is processed as the target's probabilities are (the request's temperature,
    top-k, top-p); a greedy request still drafts its argmax; a seeded request samples with the noise
    keyed by (seed, positions[i]), the key of the target's own sample there (Gumbel coupling); any
    other request samples from `generator`, the engine's stream.
    """
    if sample_method == "greedy":
        return logits.argmax(-1).tolist(), [None] * len(requests)
    tokens, qs = [], []
    for r, row, pos in zip(requests, logits, positions):
        p = r.params
        q = logits_to_probs(row, p.temperature, p.top_k, p.top_p)  # (V,)
        if p.greedy:
            tokens.append(int(row.argmax()))
        elif p.seed is not None:
            tokens.append(int(keyed_sample(q[None], p.seed, [pos])[0]))
        else:
            tokens.append(int(sample_cdf(q, generator)))  # torch.multinomial's law, 19x faster over 49152
        qs.append(q)
    return tokens, qs
