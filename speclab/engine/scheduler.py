"""Continuous batching under a token budget, with chunked prefill and preemption.

Every step the scheduler picks, for each request, how many of its not-yet-computed tokens to run:
a decoding request runs 1 token plus its drafts (1 + k), a prefilling request runs as much of its
prompt as the token budget allows (chunked prefill). Running requests go first, then waiting ones
are admitted. It also makes sure each scheduled request has cache blocks for its new tokens (plus
the drafter's lookahead slots); when the pool runs dry it *preempts* the most recently admitted
request: frees its blocks and puts it back at the head of the waiting queue, to be recomputed
from its tokens later (vLLM v1's recompute preemption).
"""

from collections import deque
from dataclasses import dataclass, field

from speclab.engine.request import Request, RequestStatus
from speclab.kv_cache import KVCacheManager


@dataclass
class ScheduledRequest:
    """One request's share of a step: `num_new_tokens` tokens from position `start`.

    Attributes (fixed when scheduled, before the step changes the request):
        start: the request's num_computed_tokens at scheduling time.
        num_spec_tokens: drafts among the new tokens (0 unless the chunk runs past the known tokens).
        samples: whether the step yields tokens for the request (its chunk reaches the known end).
    """

    request: Request
    num_new_tokens: int
    start: int = field(init=False)
    num_spec_tokens: int = field(init=False)
    samples: bool = field(init=False)

    def __post_init__(self):
        req = self.request
        self.start = req.num_computed_tokens
        end = self.start + self.num_new_tokens
        self.num_spec_tokens = max(0, end - req.num_tokens)
        self.samples = end >= req.num_tokens


class Scheduler:
    """Args:
        kv: the block bookkeeping.
        max_num_batched_tokens: token budget of one forward.
        max_num_seqs: requests running at once.
        num_lookahead_tokens: extra slots each decoding request reserves for a drafter.
    """

    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int,
                 num_lookahead_tokens: int = 0):
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.num_lookahead_tokens = num_lookahead_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.preempted: list[Request] = []  # since the engine last looked (it resets drafters' state)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledRequest]:
        budget, out = self.max_num_batched_tokens, []
        preemptions = self.num_preemptions
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens + len(req.spec_token_ids) - req.num_computed_tokens, budget)
            if not self._reserve(req, n):
                continue  # req itself was preempted; self.running shrank
            out.append(ScheduledRequest(req, n))
            budget -= n
            i += 1
        if self.num_preemptions > preemptions:
            return out  # the pool is full: admitting anyone now would only be preempted again
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self.kv.can_fit(req.request_id, req.num_computed_tokens + n + self._lookahead(req, n)):
                break  # admit nothing more until blocks free up
            self.waiting.popleft()
            self.kv.allocate(req.request_id, req.num_computed_tokens, n, self._lookahead(req, n))
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.append(ScheduledRequest(req, n))
            budget -= n
        return out

    def _lookahead(self, req: Request, n: int) -> int:
        reaches_end = req.num_computed_tokens + n >= req.num_tokens
        return self.num_lookahead_tokens if reaches_end else 0

    def _reserve(self, req: Request, n: int) -> bool:
        """Allocate blocks for req's n new tokens, preempting later requests if needed."""
        need = req.num_computed_tokens + n + self._lookahead(req, n)
        while not self.kv.can_fit(req.request_id, need):
            victim = self.running[-1]
            if victim is req and len(self.running) == 1:
                raise RuntimeError(f"request {req.request_id} needs {self.kv.blocks_for(need)} KV blocks and the "
                                   f"pool has {self.kv.pool.num_blocks}: raise num_kv_blocks")
            self._preempt(victim)
            if victim is req:
                return False
        self.kv.allocate(req.request_id, req.num_computed_tokens, n, self._lookahead(req, n))
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0
        req.spec_token_ids, req.spec_draft_probs = [], None
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.preempted.append(req)
        self.waiting.appendleft(req)

    def finish_step(self, scheduled: list[ScheduledRequest]) -> list[Request]:
        """Drop finished requests (freeing their blocks); return them."""
        done = [s.request for s in scheduled if s.request.is_finished]
        for req in done:
            self.running.remove(req)
            self.kv.free(req.request_id)
        return done
