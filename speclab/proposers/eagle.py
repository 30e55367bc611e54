"""EAGLE proposer: a head drafts from the target's hidden states, right after the target forward.

vLLM's `vllm/v1/spec_decode/eagle.py` flow (lesson 08). Each step the runner hands over, through
`observe`, the hidden states of every token the target just ran (prefill chunks, decodes, drafts
being verified). After the scheduler has committed the step, `propose` drafts for each request
that sampled, with committed tokens x_0 .. x_{L-1) of which the target has computed L - 1:

  1. first pass: one head forward over the positions t the head has not seen yet whose hidden
     state the target committed (the rows of rejected drafts are dropped), with input
     (x_{t+1}, f_t): the shifted tokens, the newest x_{L-1} included (vLLM's
     `input_ids[:-1] = target_token_ids[1:]; input_ids[last] = next_token_ids`). Its last row
     (t = L - 2) gives g and q for x_L: draft d_1;
  2. chain: k - 1 single-token steps at positions L - 1, L, ... with input (d_i, g), the head's own
     output feature fed back.

The head's KV lives in the *target's* block tables: its layer has its own cache tensors, addressed
by the same slot mapping. The chain writes positions up to L + k - 3, beyond the target's committed
tokens, into the `num_lookahead_tokens` = k slots the scheduler reserves (vLLM's lookahead);
after a rejection the head's stale entries sit where the target's do and are rewritten, from the
target's true features, by the next first pass before anything reads them. Preemption frees both.

Drafts are the argmax of q ("greedy", q treated as one-hot by the verifier, as vLLM does) or sampled
from q ("probabilistic", q kept: the rejection rule then needs it). Output stays exact either way.
"""

from __future__ import annotations

import torch

from speclab.engine.batch import flatten
from speclab.engine.proposer import Proposal, Proposer, TargetForward
from speclab.engine.request import Request
from speclab.sampling import keyed_sample, logits_to_probs

SAMPLE_METHODS = ("greedy", "probabilistic")


def draft_tokens(requests, logits: torch.Tensor, positions: list[int], sample_method: str,
                 generator: torch.Generator | None) -> tuple[list[int], list[torch.Tensor | None]]:
    """One draft per row of `logits` (B, V): argmax, or sampled from q processed as the target's
    probabilities are (temperature, top-k, top-p), keyed by output position for seeded requests."""
    if sample_method == "greedy":
        return logits.argmax(-1).tolist(), [None] * len(requests)
    tokens, qs = [], []
    for r, row, pos in zip(requests, logits, positions):
        p = r.params
        q = logits_to_probs(row, p.temperature, p.top_k, p.top_p)  # (V,)
        if p.greedy:
            tokens.append(int(row.argmax()))
        elif p.seed is not None:  # the key the target's own sample uses at this position (Gumbel coupling)
            tokens.append(int(keyed_sample(q[None], p.seed, [pos])[0]))
        else:
            tokens.append(int(torch.multinomial(q, 1, generator=generator)))
        qs.append(q)
    return tokens, qs


class EagleProposer(Proposer):
    """Args:
        head: an EagleHead (or MTPHead) bound to the engine's target (speclab.models.heads.load_head).
        num_speculative_tokens: k.
        sample_method: "greedy" or "probabilistic".
        generator: stream for unseeded sampled drafts; None: the engine hands over its own.
    """

    def __init__(self, head, num_speculative_tokens: int, sample_method: str = "greedy",
                 generator: torch.Generator | None = None):
        if sample_method not in SAMPLE_METHODS:
            raise ValueError(f"sample_method must be one of {SAMPLE_METHODS}, got {sample_method!r}")
        if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
                or num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be an integer > 0, got {num_speculative_tokens!r}")
        self.head = head
        self.num_speculative_tokens = num_speculative_tokens
        self.num_lookahead_tokens = num_speculative_tokens  # vLLM: k slots for the chain
        self.hidden_layers = tuple(head.cfg.hidden_layers)
        self.sample_method = sample_method
        self.generator = generator
        self.kv = None
        self.cache = None
        self.pending: dict[str, tuple[int, torch.Tensor]] = {}  # request id -> (first position, target rows)

    def attach_kv(self, kv) -> None:
        self.kv = kv
        self.cache = self.head.allocate_kv_cache(kv.pool.num_blocks, kv.block_size)

    def observe(self, forward: TargetForward) -> None:
        """Queue each request's new rows after the ones the head has not consumed yet."""
        q = forward.query_start_loc
        for b, (rid, start) in enumerate(zip(forward.request_ids, forward.starts)):
            rows = forward.hidden[q[b]:q[b + 1]]
            p0, old = self.pending.get(rid, (start, rows[:0]))
            if p0 <= start <= p0 + len(old):  # contiguous (rows at >= start were rejected drafts: replaced)
                rows = torch.cat([old[:start - p0], rows])
            else:  # a gap (never in this engine): the head's KV there is stale; drafts get worse, output stays exact
                p0 = start
            self.pending[rid] = (p0, rows)

    def remove(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.pending.pop(rid, None)

    @torch.inference_mode()
    def propose(self, requests: list[Request], max_drafts: list[int]) -> list[Proposal]:
        if self.kv is None:
            raise RuntimeError("EagleProposer has no KV: the engine calls attach_kv (use LLMEngine or LLM)")
        chunks, feats = [], []
        for r in requests:  # first pass: every committed row not yet seen, for all handed requests
            p0, rows = self.pending.pop(r.request_id, (r.num_computed_tokens, None))
            n = r.num_computed_tokens - p0
            if rows is not None:  # the next forward's rows start where the target's committed ones end
                self.pending[r.request_id] = (r.num_computed_tokens, rows[:0])
            if rows is None or n <= 0 or len(rows) < n:
                chunks.append(None)
                continue
            chunks.append((r.request_id, r.all_token_ids[p0 + 1:p0 + 1 + n], p0))
            feats.append(self.head.features(rows[:n]))
        live = [i for i, c in enumerate(chunks) if c is not None]
        drafts = [[] for _ in requests]
        qs = [[] for _ in requests]
        if not live:
            return [Proposal([]) for _ in requests]
        g = self._forward([chunks[i] for i in live], torch.cat(feats))  # (len(live), d): last rows
        active = [i for i in live if max_drafts[i] > 0]
        g = g[[live.index(i) for i in active]]
        for step in range(max((max_drafts[i] for i in active), default=0)):
            reqs = [requests[i] for i in active]
            toks, q = draft_tokens(reqs, self.head.logits(g), [len(r.output_token_ids) + step for r in reqs],
                                   self.sample_method, self.generator)
            for i, t, qi in zip(active, toks, q):
                drafts[i].append(t)
                qs[i].append(qi)
            more = [j for j, i in enumerate(active) if max_drafts[i] > step + 1]
            if not more:
                break
            active = [active[j] for j in more]
            g = self._forward([(requests[i].request_id, [toks[j]], requests[i].num_computed_tokens + step)
                               for j, i in zip(more, active)], g[more])
        return [Proposal(d, None if self.sample_method == "greedy" or not d else torch.stack(q))
                for d, q in zip(drafts, qs)]

    def _forward(self, chunks, feature: torch.Tensor) -> torch.Tensor:
        """One head forward over (request id, tokens, first position) chunks; each chunk's last g."""
        input_ids, meta = flatten(self.kv, chunks, self.head.fc.weight.device)
        g = self.head(input_ids, feature, meta, self.cache)
        return g[torch.tensor(meta.query_start_loc[1:]) - 1]
