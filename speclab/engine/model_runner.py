"""The model runner: scheduled requests -> one flattened forward -> verified tokens -> next drafts.

One step, for whatever mix of prefill chunks and decodes the scheduler chose:
  1. flatten: every request's new tokens concatenated, with positions, cache slots, block tables;
  2. run the target once over all of them;
  3. take the logits rows that decide tokens: for a request that reached the end of its known
     tokens, its last 1 + k rows (k drafts to verify, plus the bonus row);
  4. process them into probabilities (temperature, top-k, top-p per request);
  5. call `rejection_sample` for the whole batch. A request with no drafts is just a k = 0 row:
     plain sampling is the bonus token of an empty draft (a batch of such rows at a temperature alone
     skips the verifier and runs that token's exponential race directly, `_race`: the same numbers).
     A request whose drafts form a tree (lesson 10) ran with an ancestor-only mask and positions by
     depth; it is verified on its own (`speclab.verify.tree`), and its accepted path's keys and values
     are moved into the slots right after the root (`_compact`), so its cache is one sequence again.
After the scheduler has committed the step, `propose` asks the proposer for the next drafts, and
hands a head this step's hidden states (`ModelRunnerOutput.forward`) in the same step.

Randomness. Greedy requests draw nothing. Requests without a seed use Leviathan's rule with the
engine's stream. A seeded request is sampled position by position first, each token by an
exponential race whose noise is keyed by (seed, output position) (`speclab.sampling.keyed_sample`),
and its drafts are then verified greedily against those samples: a draft is accepted iff it equals
the target's own sample there. For one-hot drafts (n-gram, argmax drafters) this *is* the rejection
rule (accepted with probability p(x); otherwise the race's winner is distributed as max(p - q, 0));
its output is the target's sample at every position whatever was drafted, truncated or preempted
(drafter invariance, Daliri et al. 2024). A probabilistic drafter samples with the same keys
(Gumbel coupling), which keeps this invariance at an acceptance somewhat below sum min(p, q).
"""

from dataclasses import dataclass, field

import torch

from speclab.engine.batch import TreeChunk, flatten
from speclab.engine.proposer import Proposer, TargetForward
from speclab.engine.scheduler import ScheduledRequest, SchedulerOutput
from speclab.kv_cache import KVCacheManager
from speclab.models.llama import LlamaForCausalLM
from speclab.sampling import keyed_sample, logits_to_probs, temperature_only
from speclab.verify import PLACEHOLDER_TOKEN_ID, draw_noise, draw_uniforms, verify_greedy_step
from speclab.verify.backend import get_rejection_sampler
from speclab.verify.tree import sample_tree, sample_tree_drawn
from speclab.verify.tree import walk as tree_walk


@dataclass
class ModelRunnerOutput:
    """sampled: per request that sampled, its accepted drafts then one token; errors: per request
    whose step could not be completed, why; forward: the hidden states a head reads (None without one)."""

    sampled: dict[str, list[int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    forward: TargetForward | None = None


class ModelRunner:
    """Owns the model, its cache tensors and the proposer.

    Args:
        model: speclab's Llama forward.
        kv: the block bookkeeping (the scheduler changes it; the runner only reads it).
        generator: the stream for requests without a seed.
        verifier: "torch", "triton" or "auto" (Triton on a GPU); None reads SPECLAB_VERIFIER.
        proposer: drafts tokens for decoding requests (None: plain decoding).
        rejection_sample_method: the verification rule (speclab.verify.RULES).
    """

    def __init__(self, model: LlamaForCausalLM, kv: KVCacheManager, generator: torch.Generator,
                 verifier: str | None = None, proposer: Proposer | None = None,
                 rejection_sample_method: str = "standard"):
        self.model = model
        self.kv = kv
        self.generator = generator
        self.device = model.lm_head.weight.device
        self.kv_caches = model.allocate_kv_cache(kv.pool.num_blocks, kv.block_size)
        self.verifier = get_rejection_sampler(verifier, rejection_sample_method)
        self.proposer = proposer

    def execute(self, output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step: forward, then verification for every request that samples."""
        if self.proposer and output.preempted_req_ids:
            self.proposer.remove(output.preempted_req_ids)  # the target's cache of them is gone
        scheduled = output.scheduled
        input_ids, meta = flatten(self.kv, [self._chunk(s) for s in scheduled], self.device)
        layers = self.proposer.hidden_layers if self.proposer else ()
        hidden, saved = self.model(input_ids, meta, self.kv_caches, layers)  # (N, D)
        result = ModelRunnerOutput()
        if layers:  # a head drafts from this forward's hidden states after the commit (lesson 08)
            result.forward = TargetForward([s.request for s in scheduled], [s.start for s in scheduled],
                                           meta.query_start_loc, torch.cat(saved, -1))
        result.sampled = self._sample(scheduled, hidden, meta, result)
        return result

    def _sample(self, scheduled: list[ScheduledRequest], hidden: torch.Tensor, meta, result) -> dict[str, list[int]]:
        """Logits of the rows that decide tokens, then verification: chains as one batch, trees one by one."""
        sampling, rows = [], []
        for i, s in enumerate(scheduled):  # the last 1 + k rows of each sampling request
            if s.samples:
                end = meta.query_start_loc[i + 1]
                sampling.append(s)
                rows.append(torch.arange(end - 1 - s.num_draft_tokens, end))
        if not sampling:
            return {}
        logits = self.model.compute_logits(hidden[torch.cat(rows).to(self.device)])  # (T + B, V)
        unusable = {i: why for i, s in enumerate(sampling) if (why := s.request.params.engine_problem())}
        # one reduction per step, the rest when it fails: a NaN or inf anywhere makes the sum NaN or inf (so
        # does finite logits' sum overflowing, which only sends the step to the exact check). isfinite().all()
        # over (9, 49152) logits took 0.95 ms, the sum 0.03 (2026-12-04's Xeon): 4 % of a bfloat16 verify step
        if unusable or not bool(torch.isfinite(logits.sum())):
            sampling, logits = self._drop_failed(sampling, logits, result.errors, unusable)
        sampled = {}
        if any(s.tree is not None for s in sampling):  # lesson 10: trees apart, then compacted
            sampling, logits, paths = self._verify_trees(sampling, logits, sampled)
            if result.forward is not None:
                index = {id(s): b for b, s in enumerate(scheduled)}
                result.forward.paths = {index[id(s)]: [0] + path for s, path in paths}
        if sampling and all(s.request.params.greedy for s in sampling):  # vLLM's all_greedy fast path
            sampled.update(self.verify_greedy(sampling, logits))
        elif sampling:
            out = self.verify(sampling, logits).cpu()
            sampled.update({s.request.request_id: row[row != PLACEHOLDER_TOKEN_ID].tolist()
                            for s, row in zip(sampling, out)})
        return sampled

    @staticmethod
    def _chunk(s: ScheduledRequest):
        """A request's share of the flattened forward: a causal chunk, or its root and tree of drafts."""
        if s.tree is None:
            return s.request.request_id, s.token_ids, s.start
        positions = [s.start + d for d in s.tree.depths]
        return s.request.request_id, s.token_ids, s.start, TreeChunk(positions, s.start, s.tree.attention_mask())

    def _verify_trees(self, sampling, logits, sampled: dict[str, list[int]]):
        """Verify each tree request (speclab.verify.tree), move its accepted path's keys and values into
        the slots right after the root, and return the chain requests with their rows, and the paths."""
        chains, rows, paths, start = [], [], [], 0
        for s in sampling:
            n = s.num_draft_tokens + 1
            if s.tree is None:
                chains.append(s)
                rows.append(torch.arange(start, start + n))
            else:
                path, tokens = self._verify_tree(s, logits[start:start + n])
                sampled[s.request.request_id] = tokens
                self._compact(s, path)
                paths.append((s, path))
            start += n
        keep = torch.cat(rows).to(logits.device) if rows else torch.zeros(0, dtype=torch.long, device=logits.device)
        return chains, logits[keep], paths

    def _verify_tree(self, s: ScheduledRequest, logits: torch.Tensor) -> tuple[list[int], list[int]]:
        """Greedy and seeded requests walk the tree against the target's own sample at each node; the
        others sample it exactly with the engine's stream: `sample_tree` for top-k children (point
        masses), `sample_tree_drawn` for children drawn from q (their q rows came with the drafts)."""
        p, tree, drafts = s.request.params, s.tree, s.request.spec_token_ids[:s.num_draft_tokens]
        if p.greedy:
            return tree_walk(tree, drafts, logits.max(-1).indices)  # argmax's first maximum, 3x faster on a CPU
        probs = logits_to_probs(logits, p.temperature, p.top_k, p.top_p)  # (N + 1, V)
        if p.seed is not None:  # row i decides output position num_output_tokens + depth(i)
            keys = [s.num_output_tokens + d for d in tree.depths]
            return tree_walk(tree, drafts, keyed_sample(probs, p.seed, keys))
        q = s.request.spec_draft_probs
        if q is not None:
            return sample_tree_drawn(tree, drafts, probs, q[:s.num_draft_tokens].to(probs.device), self.generator)
        return sample_tree(tree, drafts, probs, self.generator)

    def _compact(self, s: ScheduledRequest, path: list[int]) -> None:
        """KV compaction: the accepted nodes' keys and values, written at slots start + node, move to
        start + 1, start + 2, ... so the request's cache is one contiguous sequence again (nodes only move
        down: node path[i] >= i + 1 in breadth-first order). The rest is rolled back by the scheduler."""
        moved = [(i + 1, node) for i, node in enumerate(path) if node != i + 1]
        if not moved:
            return
        rid = s.request.request_id
        dst = torch.tensor([self.kv.slot_mapping(rid, s.start + i, 1)[0] for i, _ in moved], device=self.device)
        src = torch.tensor([self.kv.slot_mapping(rid, s.start + node, 1)[0] for _, node in moved], device=self.device)
        for k_cache, v_cache in self.kv_caches:
            for cache in (k_cache, v_cache):
                flat = cache.view(-1, *cache.shape[2:])
                flat.index_copy_(0, dst, flat.index_select(0, src))

    @staticmethod
    def _drop_failed(sampling, logits, errors: dict[str, str], unusable: dict[int, str]):
        """Fail the requests whose rows hold NaN or inf, or whose params cannot become the sampler's
        float32/int64 rows (`unusable`, by index); return the others and their rows."""
        sizes = torch.tensor([s.num_draft_tokens + 1 for s in sampling])
        owner = torch.repeat_interleave(torch.arange(len(sampling)), sizes).to(logits.device)  # (T + B,)
        bad = set(owner[~torch.isfinite(logits).all(-1)].tolist()) | set(unusable)
        for i in sorted(bad):
            errors[sampling[i].request.request_id] = unusable.get(i, "the model produced NaN or inf logits")
        keep = torch.tensor([int(i) not in bad for i in owner.tolist()], device=logits.device)
        return [s for i, s in enumerate(sampling) if i not in bad], logits[keep]

    def verify_greedy(self, sampling: list[ScheduledRequest], logits: torch.Tensor) -> dict[str, list[int]]:
        """All requests greedy: no probabilities, no random numbers (`verify_greedy_step` per request)."""
        out, row = {}, 0
        for s in sampling:
            k = s.num_draft_tokens
            out[s.request.request_id] = verify_greedy_step(s.request.spec_token_ids[:k], logits[row:row + k + 1])
            row += k + 1
        return out

    def verify(self, sampling: list[ScheduledRequest], logits: torch.Tensor) -> torch.Tensor:
        """Process logits per request and verify every request's drafts (k = 0 allowed) at once."""
        ks = [s.num_draft_tokens for s in sampling]
        params = [s.request.params for s in sampling]
        if not any(ks) and all(p.seed is None and temperature_only(p.temperature, p.top_k, p.top_p, logits.shape[-1])
                               for p in params):
            return self._race(params, logits)
        per_row = lambda f: torch.tensor([f(p) for p, k in zip(params, ks) for _ in range(k + 1)])  # noqa: E731
        probs = logits_to_probs(logits, per_row(lambda p: p.temperature), per_row(lambda p: p.top_k),
                                per_row(lambda p: p.top_p))  # (T + B, V)
        drafts = [t for s in sampling for t in s.request.spec_token_ids[:s.num_draft_tokens]]
        q = [s.request.spec_draft_probs[:s.num_draft_tokens] for s in sampling
             if s.num_draft_tokens and s.request.spec_draft_probs is not None]
        if q and len(q) != sum(1 for k in ks if k):
            raise RuntimeError("some requests' drafts carry q and others do not: one proposer drafts for all")
        draft_probs = torch.cat(q).to(self.device) if q else None  # (T, V) or one-hot drafts
        greedy = torch.tensor([p.greedy or p.seed is not None for p in params])
        start = 0
        for s, k, p in zip(sampling, ks, params):  # seeded: sample each position with keyed noise first
            if p.seed is not None and not p.greedy:
                y = keyed_sample(probs[start:start + k + 1], p.seed, range(s.num_output_tokens, s.num_output_tokens + k + 1))
                probs[start:start + k + 1] = torch.nn.functional.one_hot(y, probs.shape[-1]).to(probs.dtype)
            start += k + 1
        uniforms, noise = self._draw(ks, ~greedy, probs.shape[-1])
        return self.verifier(torch.tensor(drafts, dtype=torch.long, device=self.device), ks, probs, draft_probs,
                             greedy=greedy.to(self.device), uniforms=uniforms, noise=noise)

    def _race(self, params, logits: torch.Tensor) -> torch.Tensor:
        """Plain sampling at a temperature alone (no drafts, no seed, no top-k or top-p: a T > 0 decode step
        without speculation): each row's probabilities and the exponential race, the very numbers the
        verifier computes for a k = 0 row, from the same draws of the stream, without its batch checks
        and per-row tensors: 1.6-1.9 -> 0.8-0.9 ms a step over SmolLM2's 49152 tokens, about half of it the
        Exp(1) noise (2026-12-07, Zen 5, one thread)."""
        _, noise = self._draw([0] * len(params), torch.ones(len(params), dtype=torch.bool), logits.shape[-1])
        probs = torch.cat([logits_to_probs(logits[i:i + 1], p.temperature, p.top_k, p.top_p)
                           for i, p in enumerate(params)])
        return (probs / noise).argmax(-1, keepdim=True)  # (B, 1)

    def _draw(self, ks: list[int], random: torch.Tensor, V: int):
        """Uniforms (T,) and noise (B, V) from the engine's stream for the random rows; placeholders
        (never read) for greedy and seeded rows, which must not advance the stream."""
        k = torch.tensor(ks)
        uniforms = torch.full((int(k.sum()),), 0.5, dtype=torch.float64)
        noise = torch.ones(len(ks), V)
        if bool(random.any()):
            per_token = random.repeat_interleave(k)
            uniforms[per_token] = draw_uniforms(int(per_token.sum()), self.generator, "cpu")
            noise[random] = draw_noise(int(random.sum()), V, self.generator, "cpu")
        return uniforms.to(self.device), noise.to(self.device)

    # ------------------------------------------------------------------------------------------
    # drafting

    def propose(self, requests, k: int | None = None,
                forward: TargetForward | None = None) -> dict[str, tuple[list[int], torch.Tensor | None]]:
        """Drafts for the next step of requests that sampled this step and are still running; at most
        k each (None: the proposer's k; a speculation policy may ask for fewer, 0 included). `forward`,
        this step's hidden states, reaches a head even when no request sampled (a prefill chunk)."""
        if not self.proposer or (not requests and forward is None):
            return {}
        k = self.proposer.num_speculative_tokens if k is None else min(k, self.proposer.num_speculative_tokens)
        left = [max(0, r.params.max_tokens - len(r.output_token_ids) - 1) for r in requests]
        limits = [min(k, n) for n in left]
        proposals = (self.proposer.propose(requests, limits) if forward is None
                     else self.proposer.propose(requests, limits, forward=forward))
        return {r.request_id: self._limit(p, k, n) for r, p, n in zip(requests, proposals, left)}

    @staticmethod
    def _limit(p, k: int, left: int) -> tuple:
        """At most k drafts and `left` (the tokens left before max_tokens); a tree keeps its first k
        nodes (a policy's k is the verified budget) down to depth `left` (what it can still accept)."""
        if p.tree is not None:  # a breadth-first prefix: its nodes' q rows (drawn children) are the first rows
            tree = p.tree.truncate(min(k, p.tree.num_nodes)).up_to_depth(left)
            q = None if p.draft_probs is None else p.draft_probs[:tree.num_nodes]
            return p.token_ids[:tree.num_nodes], q, tree
        n = min(k, left)
        return p.token_ids[:n], None if p.draft_probs is None else p.draft_probs[:n]

    def remove_requests(self, request_ids: list[str]) -> None:
        if self.proposer and request_ids:
            self.proposer.remove(request_ids)
