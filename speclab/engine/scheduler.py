"""Continuous batching under a token budget, with chunked prefill and preemption. Owns request state.

Every step the scheduler picks, for each request, how many of its not-yet-computed tokens to run:
a decoding request runs 1 token plus its drafts (1 + k, fewer when the budget runs out: the drafts
are truncated), a prefilling request runs as much of its prompt as the budget allows (chunked
prefill). Running requests go first, then waiting ones are admitted. Each scheduled request gets
cache blocks for its new tokens plus `num_lookahead_tokens` slots for a drafter that writes into
the target's block tables (EAGLE/MTP heads); when the pool runs dry the most recently admitted
request is *preempted*: its blocks are freed and it goes back to the head of the waiting queue, to
be recomputed from its tokens later (vLLM v1's recompute preemption). With prefix caching on
(speclab.kv_cache), an admitted request first takes the cached blocks of its longest computed prefix
and runs only the tokens after them; a preempted request finds its own blocks there again while
nobody has taken them.

As in vLLM v1 (and nano-vllm), the scheduler is the one writer of request state:
  schedule()               -> SchedulerOutput: who runs, how many tokens, who was preempted
  update_from_output(...)  applies the step's result: num_computed_tokens moves forward by the
                           scheduled tokens and back by the rejected drafts, the cache rolls back,
                           tokens are appended, stops are checked, finished requests are freed
  update_draft_token_ids   stores the proposer's drafts for the next step
  finish_requests(...)     aborts requests (blocks freed at once)
"""

from collections import deque
from dataclasses import dataclass, field

from speclab.engine.request import Request, RequestStatus
from speclab.kv_cache import KVCacheManager
from speclab.metrics import SpecDecodingStats


@dataclass
class ScheduledRequest:
    """One request's share of a step: `num_new_tokens` tokens from position `start`.

    Attributes (fixed when scheduled, before the step changes the request):
        start: the request's num_computed_tokens at scheduling time.
        num_draft_tokens: drafts among the new tokens (fewer than proposed when the budget truncates them).
        samples: whether the step yields tokens for the request (its chunk reaches the known end).
        num_output_tokens: the request's generated tokens so far: row j of its verification decides
            output position num_output_tokens + j (what keys a seeded request's randomness).
        tree: the drafts' tree (TokenTree) truncated to num_draft_tokens nodes, or None for a chain.
    """

    request: Request
    num_new_tokens: int
    start: int = field(init=False)
    num_draft_tokens: int = field(init=False)
    samples: bool = field(init=False)
    num_output_tokens: int = field(init=False)
    tree: object = field(init=False)

    def __post_init__(self):
        req = self.request
        self.start = req.num_computed_tokens
        end = self.start + self.num_new_tokens
        self.num_draft_tokens = max(0, end - req.num_tokens)
        self.samples = end >= req.num_tokens
        self.num_output_tokens = len(req.output_token_ids)
        self.tree = req.spec_tree.truncate(self.num_draft_tokens) if req.spec_tree and self.num_draft_tokens else None

    @property
    def token_ids(self) -> list[int]:
        """The tokens this step feeds: known tokens, then drafts."""
        req, end = self.request, self.start + self.num_new_tokens
        known = req.all_token_ids[self.start:end]
        return known + req.spec_token_ids[:end - self.start - len(known)]


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    preempted_req_ids: list[str] = field(default_factory=list)


@dataclass
class StepResult:
    """What a step changed. finished: requests that ended (stop, length, error); decoding: requests
    that sampled this step and are still running (they get new drafts)."""

    finished: list[Request] = field(default_factory=list)
    decoding: list[Request] = field(default_factory=list)


class Scheduler:
    """Args:
        kv: the target's block bookkeeping (only the scheduler changes it).
        max_num_batched_tokens: token budget of one forward.
        max_num_seqs: requests running at once.
        num_lookahead_tokens: extra slots each decoding request reserves for a drafter.
        eos_token_id: the model's end-of-sequence token (a stop unless ignore_eos).
        num_speculative_tokens: k, for the spec-decode counters.
    """

    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int,
                 num_lookahead_tokens: int = 0, eos_token_id: int | None = None, num_speculative_tokens: int = 0):
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.num_lookahead_tokens = num_lookahead_tokens
        self.eos_token_id = eos_token_id
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.num_preemptions = 0
        self.stats = SpecDecodingStats(num_speculative_tokens)

    def add_request(self, req: Request) -> None:
        self.waiting.append(req)
        self.requests[req.request_id] = req

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------------------------------------
    # schedule

    def schedule(self) -> SchedulerOutput:
        budget, out = self.max_num_batched_tokens, SchedulerOutput([])
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens + len(req.spec_token_ids) - req.num_computed_tokens, budget)
            if not self._reserve(req, n, out.preempted_req_ids):
                continue  # req itself was preempted; self.running shrank
            out.scheduled.append(ScheduledRequest(req, n))
            budget -= n
            i += 1
        if out.preempted_req_ids:
            return out  # the pool is full: admitting anyone now would only be preempted again
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            # with prefix caching, the leading full blocks another request computed are shared, not computed
            cached = self.kv.enable_prefix_caching and req.num_computed_tokens == 0
            prefix = self.kv.match_prefix(req.all_token_ids) if cached else []
            start = req.num_computed_tokens + len(prefix) * self.kv.block_size
            n = min(req.num_tokens - start, budget)
            lookahead = self._lookahead(req, n, start)
            if not self.kv.can_fit(req.request_id, start + n + lookahead, prefix):
                break  # admit nothing more until blocks free up
            self.waiting.popleft()
            self.kv.allocate(req.request_id, start, n, lookahead, prefix)
            if cached:
                self.kv.prefix_cache_queries += req.num_tokens
                self.kv.prefix_cache_hits += start
            req.num_computed_tokens = start
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, n))
            budget -= n
        if not out.scheduled and self.requests:
            raise RuntimeError("nothing could be scheduled: the KV pool is too small for any waiting request")
        return out

    def _lookahead(self, req: Request, n: int, start: int | None = None) -> int:
        reaches_end = (req.num_computed_tokens if start is None else start) + n >= req.num_tokens
        return self.num_lookahead_tokens if reaches_end else 0

    def _reserve(self, req: Request, n: int, preempted: list[str]) -> bool:
        """Allocate blocks for req's n new tokens, preempting later requests if needed."""
        need = req.num_computed_tokens + n + self._lookahead(req, n)
        while not self.kv.can_fit(req.request_id, need):
            victim = self.running[-1]
            if victim is req and len(self.running) == 1:
                raise RuntimeError(f"request {req.request_id} needs {self.kv.blocks_for(need)} KV blocks and the "
                                   f"pool has {self.kv.pool.num_blocks}: raise num_kv_blocks")
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is req:
                return False
        self.kv.allocate(req.request_id, req.num_computed_tokens, n, self._lookahead(req, n))
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0
        req.spec_token_ids, req.spec_draft_probs, req.spec_tree = [], None, None
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------------------------------
    # apply a step's result

    def update_from_output(self, output: SchedulerOutput, sampled: dict[str, list[int]],
                           errors: dict[str, str] | None = None) -> StepResult:
        """Commit one step.

        Args:
            output: what `schedule` returned for this step.
            sampled: per request that sampled, its accepted drafts followed by one new token.
            errors: per request whose step failed (non-finite logits, ...), the reason; it is finished
                with finish_reason "error".
        """
        result = StepResult()
        for s in output.scheduled:
            req = s.request
            if req.is_finished:  # aborted while the step ran
                continue
            req.num_computed_tokens += s.num_new_tokens
            if errors and req.request_id in errors:
                req.finish("error", errors[req.request_id])
            elif req.request_id in sampled:
                self._commit(req, s.num_draft_tokens, sampled[req.request_id])
            if self.kv.enable_prefix_caching and req.finish_reason != "error":  # full blocks: keyed for reuse
                self.kv.cache_full_blocks(req.request_id, req.all_token_ids, req.num_computed_tokens)
            if req.is_finished:
                self._free(req)
                result.finished.append(req)
            elif s.samples:
                result.decoding.append(req)
        return result

    def _commit(self, req: Request, k: int, tokens: list[int]) -> None:
        """Keep the accepted drafts and the new token; roll the cache back past the rejected drafts.
        (A tree's accepted path was already moved into the slots after the root by the runner.)"""
        accepted = len(tokens) - 1
        if not 0 <= accepted <= k:
            raise RuntimeError(f"request {req.request_id}: {len(tokens)} tokens back from verifying {k} drafts")
        if k:
            req.num_computed_tokens -= k - accepted  # the rejected drafts' KV is stale
            # a head that drafts after this step writes its chain into the lookahead slots: keep them
            self.kv.rollback(req.request_id, req.num_computed_tokens + self.num_lookahead_tokens)
            self.stats.observe(k, accepted)
        req.spec_token_ids, req.spec_draft_probs, req.spec_tree = [], None, None
        req.append_tokens(tokens, self.eos_token_id)

    def update_draft_token_ids(self, drafts: dict[str, tuple]) -> None:
        """Store each request's drafts (token ids, q rows or None[, their TokenTree]) for its next step."""
        for rid, (token_ids, draft_probs, *tree) in drafts.items():
            req = self.requests.get(rid)
            if req is not None and req.status == RequestStatus.RUNNING:
                req.spec_token_ids, req.spec_draft_probs = list(token_ids), draft_probs
                req.spec_tree = tree[0] if tree and token_ids else None

    def finish_requests(self, request_ids, reason: str = "abort", error: str | None = None) -> list[Request]:
        """Finish (abort) unfinished requests now: blocks freed, nothing more scheduled. Unknown or
        already finished ids are ignored. Returns the requests finished here.

        Args:
            reason: the finish_reason they get ("abort"; "stop" for a stop string the server saw;
                "error" with `error` saying why).
        """
        done = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            if req.status == RequestStatus.WAITING:
                self.waiting.remove(req)
            req.finish(reason, error)
            self._free(req)
            done.append(req)
        return done

    def _free(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        self.kv.free(req.request_id)
        self.requests.pop(req.request_id, None)
