"""The model runner: scheduled requests -> one flattened forward -> verified tokens.

One step, for whatever mix of prefill chunks and decodes the scheduler chose:
  1. flatten: every request's new tokens concatenated, with positions, cache slots, block tables;
  2. run the target once over all of them;
  3. take the logits rows that decide tokens: for a request that reached the end of its known
     tokens, its last 1 + k rows (k drafts to verify, plus the bonus row);
  4. process them into probabilities (temperature, top-k, top-p per request);
  5. call `rejection_sample` for the whole batch. A request with no drafts is just a k = 0 row:
     plain sampling is the bonus token of an empty draft.
"""

import torch

from speclab.backend import get_rejection_sampler
from speclab.engine.batch import flatten
from speclab.engine.scheduler import ScheduledRequest
from speclab.kv_cache import KVCacheManager
from speclab.models.llama import LlamaForCausalLM
from speclab.sampling import logits_to_probs
from speclab.verify import PLACEHOLDER_TOKEN_ID, draw_noise, draw_uniforms


class ModelRunner:
    """Owns the model and its cache tensors.

    Args:
        model: speclab's Llama forward.
        kv: the block bookkeeping (shared with the scheduler).
        generator: the stream for requests without a seed.
        verifier: "torch", "triton" or "auto" (Triton on a GPU); None reads SPECLAB_VERIFIER.
    """

    def __init__(self, model: LlamaForCausalLM, kv: KVCacheManager, generator: torch.Generator,
                 verifier: str | None = None):
        self.model = model
        self.kv = kv
        self.generator = generator
        self.device = model.lm_head.weight.device
        self.kv_caches = model.allocate_kv_cache(kv.pool.num_blocks, kv.block_size)
        self.verifier = get_rejection_sampler(verifier)

    def build_batch(self, scheduled: list[ScheduledRequest]):
        """Flatten the scheduled tokens (the request's known tokens, then its drafts)."""
        chunks = [(s.request.request_id,
                   (s.request.all_token_ids + s.request.spec_token_ids)[s.start:s.start + s.num_new_tokens], s.start)
                  for s in scheduled]
        return flatten(self.kv, chunks, self.device)

    def execute(self, scheduled: list[ScheduledRequest]) -> dict[str, list[int]]:
        """Run one step. Returns, for each request that samples, its accepted drafts + one token."""
        input_ids, meta = self.build_batch(scheduled)
        hidden, _ = self.model(input_ids, meta, self.kv_caches)  # (N, D)
        sampling = [s for s in scheduled if s.samples]
        if not sampling:
            return {}
        rows = []
        for i, s in enumerate(scheduled):  # the last 1 + k rows of each sampling request
            if s.samples:
                end = meta.query_start_loc[i + 1]
                rows += range(end - 1 - s.num_spec_tokens, end)
        logits = self.model.compute_logits(hidden[rows])  # (T + B, V)
        out = self.verify(sampling, logits)
        return {s.request.request_id: row[row != PLACEHOLDER_TOKEN_ID].tolist()
                for s, row in zip(sampling, out.cpu())}

    def verify(self, sampling: list[ScheduledRequest], logits: torch.Tensor) -> torch.Tensor:
        """Process logits per request and verify every request's drafts (k = 0 allowed) at once."""
        ks = [s.num_spec_tokens for s in sampling]
        params = [s.request.params for s in sampling]
        per_row = lambda f: torch.tensor([f(p) for p, k in zip(params, ks) for _ in range(k + 1)])  # noqa: E731
        probs = logits_to_probs(logits, per_row(lambda p: p.temperature), per_row(lambda p: p.top_k),
                                per_row(lambda p: p.top_p))
        drafts = [t for s in sampling for t in s.request.spec_token_ids[:s.num_spec_tokens]]
        q = [s.request.spec_draft_probs[:s.num_spec_tokens] for s in sampling
             if s.num_spec_tokens and s.request.spec_draft_probs is not None]
        draft_probs = torch.cat(q).to(self.device) if q else None  # (T, V) or one-hot drafts
        if q and len(q) != sum(1 for k in ks if k):
            raise RuntimeError("some requests' drafts carry q and others do not: one proposer drafts for all")
        greedy = torch.tensor([p.greedy for p in params])
        V = logits.shape[-1]
        uniforms, noise = [], []
        for s, k in zip(sampling, ks):  # each request draws from its own stream: seeds survive batching
            if s.request.params.greedy:  # greedy rows use argmax only: draw nothing, pass placeholders
                uniforms.append(torch.full((k,), 0.5, dtype=torch.float64))
                noise.append(torch.ones(1, V))
                continue
            g = s.request.generator or self.generator
            uniforms.append(draw_uniforms(k, g, "cpu"))
            noise.append(draw_noise(1, V, g, "cpu"))
        return self.verifier(torch.tensor(drafts, dtype=torch.long, device=self.device), ks, probs, draft_probs,
                             greedy=greedy.to(self.device), uniforms=torch.cat(uniforms).to(self.device),
                             noise=torch.cat(noise).to(self.device))
