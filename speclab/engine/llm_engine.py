"""The engine loop: schedule -> run -> verify -> commit/rollback -> propose, until every request is finished.

Speculation adds two things to plain decoding, not a second engine: a proposer that drafts the
next step's tokens for every decoding request, and, after the runner's verification, a rollback of
the target's cache by the number of rejected drafts.
"""

import itertools

import torch

from speclab.engine.model_runner import ModelRunner
from speclab.engine.request import Request
from speclab.engine.scheduler import Scheduler
from speclab.kv_cache import KVCacheManager
from speclab.metrics import SpecDecodingStats
from speclab.models.llama import LlamaForCausalLM
from speclab.proposers.base import Proposer
from speclab.sampling_params import SamplingParams


class LLMEngine:
    """Args:
        model: speclab's Llama forward.
        num_kv_blocks, block_size: the paged cache's size.
        max_num_batched_tokens, max_num_seqs: the scheduler's limits.
        seed: seeds the stream of requests that have no seed of their own.
        verifier: "torch", "triton" or "auto"; None reads SPECLAB_VERIFIER (see speclab.backend).
        proposer: drafts tokens for decoding requests (None: plain decoding).
    """

    def __init__(self, model: LlamaForCausalLM, *, num_kv_blocks: int, block_size: int = 16,
                 max_num_batched_tokens: int = 1024, max_num_seqs: int = 64, seed: int = 0,
                 verifier: str | None = None, proposer: Proposer | None = None):
        self.model = model
        self.config = model.config
        self.kv = KVCacheManager(num_kv_blocks, block_size)
        self.scheduler = Scheduler(self.kv, max_num_batched_tokens, max_num_seqs)
        self.runner = ModelRunner(model, self.kv, torch.Generator().manual_seed(seed), verifier)
        self._ids = itertools.count()
        self.proposer = proposer
        self.stats = SpecDecodingStats(proposer.num_speculative_tokens if proposer else 0)
        self.trace: list[tuple[str, list[int], list[int]]] | None = None  # set to [] to record steps

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> Request:
        """Validate and queue one request; errors name the limit and the fix."""
        if not prompt_token_ids:
            raise ValueError("empty prompt: give at least one token")
        V, max_len = self.config.vocab_size, self.config.max_position_embeddings
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= V:
            raise ValueError(f"prompt token ids must be in [0, {V}) for this model's vocabulary")
        total = len(prompt_token_ids) + params.max_tokens
        if total > max_len:
            raise ValueError(f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                             f"exceeds the model's context of {max_len} tokens: shorten the prompt or lower max_tokens")
        need = self.kv.blocks_for(total + self.scheduler.num_lookahead_tokens)
        if need > self.kv.pool.num_blocks:
            raise ValueError(f"a request of {total} tokens needs {need} KV blocks of {self.kv.block_size} tokens but "
                             f"the pool has {self.kv.pool.num_blocks}: raise num_kv_blocks or lower max_tokens")
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        req = Request(str(next(self._ids)), list(prompt_token_ids), params, generator=gen)
        self.scheduler.add(req)
        return req

    def step(self) -> list[Request]:
        """One forward over the scheduled batch. Returns the requests that finished."""
        scheduled = self.scheduler.schedule()
        if not scheduled:
            raise RuntimeError("nothing could be scheduled: the KV pool is too small for any waiting request")
        if self.proposer:
            for req in self.scheduler.preempted:
                self.proposer.on_reset(req)
        self.scheduler.preempted.clear()
        sampled = self.runner.execute(scheduled)
        for s in scheduled:
            req = s.request
            req.num_computed_tokens += s.num_new_tokens
            if req.request_id in sampled:
                self._commit(req, s.num_spec_tokens, sampled[req.request_id])
        finished = self.scheduler.finish_step(scheduled)
        if self.proposer:
            for req in finished:
                self.proposer.on_reset(req)
            self._propose()
        return finished

    def _commit(self, req: Request, k: int, tokens: list[int]) -> None:
        """Keep the accepted drafts and the new token; roll the cache back past the rejected drafts."""
        accepted = len(tokens) - 1
        if self.trace is not None:  # (request id, drafts verified, tokens emitted): for lessons and debugging
            self.trace.append((req.request_id, list(req.spec_token_ids[:k]), list(tokens)))
        if k:
            req.num_computed_tokens -= k - accepted  # the rejected drafts' KV is stale
            self.kv.rollback(req.request_id, req.num_computed_tokens)
            self.stats.observe(k, accepted)
            self.proposer.on_verified(req, k, accepted)
        req.spec_token_ids, req.spec_draft_probs = [], None
        req.append_tokens(tokens, self.config.eos_token_id)

    def _propose(self) -> None:
        """Draft the next step's tokens for every request that is decoding (not mid-prefill)."""
        decoding = [r for r in self.scheduler.running if r.num_computed_tokens == r.num_tokens - 1]
        if not decoding:
            return
        k = self.proposer.num_speculative_tokens
        limits = [min(k, r.params.max_tokens - len(r.output_token_ids) - 1) for r in decoding]
        for req, proposal in zip(decoding, self.proposer.propose(decoding, limits)):
            req.spec_token_ids, req.spec_draft_probs = proposal.token_ids, proposal.draft_probs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()
