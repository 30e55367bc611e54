"""N-gram (prompt lookup) proposer: copy what followed the last time this suffix appeared.

Saxena's prompt lookup decoding (2023), with vLLM's semantics: the longest suffix n-gram of the
context (prompt and generated tokens), prompt_lookup_min <= n <= prompt_lookup_max, that also
occurs earlier wins; among equal n the earliest occurrence wins; the drafts are the up to k tokens
that followed it. No match: no drafts. Costs no model call, so it pays wherever text repeats
(code edits, quoting, structured output) and costs almost nothing where it does not.
"""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from speclab.engine.proposer import Proposal, Proposer, ProposerContext, check_k
from speclab.engine.request import Request


class NgramProposer(Proposer):
    """Args:
        prompt_lookup_min, prompt_lookup_max: the n-gram sizes tried, longest first.
        num_speculative_tokens: k, the most tokens proposed.
    """

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int, num_speculative_tokens: int):
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min ({prompt_lookup_min}) <= prompt_lookup_max "
                             f"({prompt_lookup_max})")
        check_k(num_speculative_tokens)
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max
        self.num_speculative_tokens = num_speculative_tokens
        self._contexts: dict[str, tuple[np.ndarray, int]] = {}  # request id -> (token buffer, tokens in it)

    def propose_tokens(self, token_ids, k: int | None = None) -> list[int]:
        """Drafts for one context: the up to k tokens after the earliest match of the longest suffix."""
        k = self.num_speculative_tokens if k is None else k
        tokens = np.asarray(token_ids, dtype=np.int64)
        L = len(tokens)
        if L < self.min_n + 1 or k <= 0:
            return []
        ends = np.flatnonzero(tokens[:L - 1] == tokens[L - 1])  # earlier positions that end a 1-gram match
        length = np.ones(len(ends), dtype=np.int64)  # how far each match extends backwards (capped)
        alive = np.ones(len(ends), dtype=bool)
        for d in range(1, min(self.max_n, L - 1)):
            alive &= ends >= d
            alive[alive] = tokens[ends[alive] - d] == tokens[L - 1 - d]
            length += alive
        n = length.max(initial=0)
        if n < self.min_n:
            return []
        end = ends[np.argmax(length >= n)]  # the earliest occurrence of the longest match
        return tokens[end + 1:end + 1 + k].tolist()

    def propose(self, requests: list[Request], max_drafts: list[int], forward=None) -> list[Proposal]:
        return [Proposal(self.propose_tokens(self._context(r), k) if k > 0 else []) for r, k in zip(requests, max_drafts)]

    def _context(self, r: Request) -> np.ndarray:
        """The request's tokens as an array, copying only what is new since the last call (building
        the array from the token list each time would cost more than the lookup at 8K tokens)."""
        buf, n = self._contexts.get(r.request_id, (np.empty(0, dtype=np.int64), 0))
        if len(buf) < r.num_tokens:  # grow by doubling, keeping the tokens already copied
            buf = np.concatenate([buf[:n], np.empty(2 * r.num_tokens, dtype=np.int64)])
        P = len(r.prompt_token_ids)
        if n < P:
            buf[:P], n = r.prompt_token_ids, P
        buf[n:r.num_tokens] = r.output_token_ids[n - P:]
        self._contexts[r.request_id] = (buf, r.num_tokens)
        return buf[:r.num_tokens]

    def remove(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._contexts.pop(rid, None)


def from_config(spec, context: ProposerContext) -> NgramProposer:
    """`method: "ngram"` (the registry's constructor): prompt lookup needs nothing from the target."""
    return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max, spec.num_speculative_tokens)
