"""The engine loop: schedule -> run -> commit/rollback -> propose, until every request is finished.

Speculation adds two things to plain decoding, not a second engine: a proposer that drafts the
next step's tokens for every decoding request, and, in the scheduler's commit, a rollback of the
target's cache past the rejected drafts. Ownership follows vLLM v1: the scheduler owns request
state, the runner runs the model (and the proposer), the proposer only proposes.

    engine = LLMEngine(model, num_kv_blocks=256, proposer=NgramProposer(1, 3, 4))
    requests = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0, max_tokens=16))
"""

import itertools
import logging
import math
import numbers
import time

import torch

from speclab.engine.config import EngineConfig
from speclab.engine.model_runner import ModelRunner
from speclab.engine.proposer import Proposer
from speclab.engine.request import Request
from speclab.engine.scheduler import Scheduler, SchedulerOutput
from speclab.engine.spec_policy import SpecPolicy
from speclab.kv_cache import KVCacheManager
from speclab.metrics import SpecDecodingStats
from speclab.models.llama import LlamaForCausalLM
from speclab.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:
    """Args:
        model: speclab's Llama forward.
        config: an EngineConfig, or its fields as keyword arguments (num_kv_blocks, block_size,
            max_num_batched_tokens, max_num_seqs, seed, verifier, num_lookahead_tokens).
        proposer: drafts tokens for decoding requests (None: plain decoding).
        spec_policy: picks each step's k (engine/spec_policy.py); None: always the proposer's k.
    """

    def __init__(self, model: LlamaForCausalLM, config: EngineConfig | None = None, *,
                 proposer: Proposer | None = None, spec_policy: SpecPolicy | None = None, **knobs):
        if config is None:
            knobs.setdefault("num_speculative_tokens", proposer.num_speculative_tokens if proposer else 0)
            knobs.setdefault("num_lookahead_tokens", proposer.num_lookahead_tokens if proposer else 0)
            config = EngineConfig(**knobs)
        elif knobs:
            raise TypeError(f"pass either an EngineConfig or its fields, not both ({sorted(knobs)})")
        check_proposer(config, proposer)
        need = proposer.num_lookahead_tokens if proposer else 0
        self.model = model
        self.config = config
        self.proposer = proposer
        self.spec_policy = spec_policy if proposer is not None else None
        self.max_model_len = model.config.max_position_embeddings
        self.kv = KVCacheManager(config.num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv, config.max_num_batched_tokens, config.max_num_seqs,
                                   config.num_lookahead_tokens, model.config.eos_token_id,
                                   config.num_speculative_tokens)
        self.runner = ModelRunner(model, self.kv, torch.Generator().manual_seed(config.seed), config.verifier,
                                  proposer, config.rejection_sample_method)
        if need:
            proposer.attach_kv(self.kv)  # its cache lives in the target's block tables
        if proposer is not None and proposer.generator is None:
            proposer.generator = self.runner.generator  # one stream: no accidental correlation between two
        self._ids = itertools.count()
        self.trace: list[tuple[str, list[int], list[int]]] | None = None  # set to [] to record steps

    @property
    def stats(self) -> SpecDecodingStats:
        """The spec-decode counters (the scheduler counts them as it commits)."""
        return self.scheduler.stats

    # ------------------------------------------------------------------------------------------
    # requests in

    def check_request(self, prompt_token_ids, params) -> list[int]:
        """Validate one request without queueing it; returns the prompt as a list of ints.
        Errors name the limit and the fix."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        params.validate()  # it may have been changed since it was made
        if isinstance(prompt_token_ids, torch.Tensor):
            prompt_token_ids = prompt_token_ids.tolist()
        if isinstance(prompt_token_ids, (str, bytes)) or not hasattr(prompt_token_ids, "__iter__"):
            raise TypeError(f"prompt_token_ids must be a list of ints, got {type(prompt_token_ids).__name__}")
        ids = list(prompt_token_ids)
        if not ids:
            raise ValueError("empty prompt: give at least one token")
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
        if bad is not None:
            raise ValueError(f"prompt token ids must be integers, got {bad!r} ({type(bad).__name__}): "
                             f"token ids are never rounded")
        ids = [int(t) for t in ids]
        V = self.model.config.vocab_size
        if min(ids) < 0 or max(ids) >= V:
            raise ValueError(f"prompt token ids must be in [0, {V}) for this model's vocabulary, "
                             f"got {min(ids) if min(ids) < 0 else max(ids)}")
        bad = next((t for t in params.stop_token_ids if t >= V), None)
        if bad is not None:
            raise ValueError(f"stop_token_ids must be in [0, {V}) for this model's vocabulary, got {bad}: "
                             f"a token the model cannot produce never stops a request")
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                             f"exceeds the model's context of {self.max_model_len} tokens: shorten the prompt or "
                             f"lower max_tokens")
        need = self.kv.blocks_for(total + self.config.num_lookahead_tokens)
        if need > self.kv.pool.num_blocks:
            raise ValueError(f"a request of {total} tokens needs {need} KV blocks of {self.kv.block_size} tokens "
                             f"but the pool has {self.kv.pool.num_blocks}: raise num_kv_blocks or lower max_tokens")
        return ids

    def add_request(self, prompt_token_ids, params: SamplingParams) -> Request:
        """Validate and queue one request. The request keeps its own copy of `params`."""
        ids = self.check_request(prompt_token_ids, params)
        req = Request(str(next(self._ids)), ids, params.for_vocab(self.model.config.vocab_size))
        self.scheduler.add_request(req)
        return req

    def abort(self, request_ids, reason: str = "abort") -> list[Request]:
        """Cancel requests (by id): blocks freed, proposer state dropped, finish_reason `reason` ("abort";
        a server that saw a stop string in the text ends the request with "stop")."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        done = self.scheduler.finish_requests(ids, reason)
        self.runner.remove_requests([r.request_id for r in done])
        return done

    # ------------------------------------------------------------------------------------------
    # the loop

    def step(self) -> list[Request]:
        """One forward over the scheduled batch. Returns the requests that finished.

        A step that raises (a bug, an out-of-memory, a kernel error) never takes the engine down:
        the requests it scheduled finish with finish_reason "error" (their blocks freed), every other
        request goes on, and the next step runs as usual. (A failure inside one request's rows, such
        as NaN logits, is narrower still: the runner fails that request alone.)
        """
        try:
            output = self.scheduler.schedule()
        except Exception as e:  # noqa: BLE001 - the scheduler's invariants broke: nothing can progress
            return self._fail(list(self.scheduler.requests), e, "schedule")
        try:
            return self._step(output)
        except Exception as e:  # noqa: BLE001 - fail this step's requests, keep the engine
            return self._fail([s.request.request_id for s in output.scheduled], e, "step")

    def _fail(self, request_ids: list[str], e: Exception, where: str) -> list[Request]:
        logger.error("the engine %s failed; finishing its %d request(s) with an error", where, len(request_ids),
                     exc_info=e)
        done = self.scheduler.finish_requests(request_ids, "error",
                                              f"the engine {where} failed ({type(e).__name__}: {e})")
        self.runner.remove_requests([r.request_id for r in done])
        return done

    def _step(self, output: SchedulerOutput) -> list[Request]:
        t0 = time.perf_counter()
        result = self.runner.execute(output)
        t_target = time.perf_counter() - t0
        if self.trace is not None:  # (request id, drafts verified, tokens emitted): for lessons and debugging
            for s in output.scheduled:
                if s.request.request_id in result.sampled:
                    self.trace.append((s.request.request_id, s.request.spec_token_ids[:s.num_draft_tokens],
                                       list(result.sampled[s.request.request_id])))
        step = self.scheduler.update_from_output(output, result.sampled, result.errors)
        self.runner.remove_requests([r.request_id for r in step.finished])
        if self.spec_policy is None:
            self.scheduler.update_draft_token_ids(self.runner.propose(step.decoding, forward=result.forward))
        else:
            self._propose_with_policy(output, step.decoding, t_target, result.forward)
        return step.finished

    def _propose_with_policy(self, output: SchedulerOutput, decoding, t_target: float, forward) -> None:
        """Draft the k the policy picks for this batch size, and report the step's costs to it."""
        k = self.spec_policy.choose(len(decoding)) if decoding else 0
        t0 = time.perf_counter()
        drafts = self.runner.propose(decoding, k, forward)
        t_draft = time.perf_counter() - t0
        self.scheduler.update_draft_token_ids(drafts)
        scheduled = output.scheduled
        self.spec_policy.observe(
            num_tokens=sum(s.num_new_tokens for s in scheduled), target_seconds=t_target, batch_size=len(decoding),
            decode_only=bool(scheduled) and all(s.num_new_tokens == 1 + s.num_draft_tokens for s in scheduled),
            num_verifying=sum(1 for s in scheduled if s.num_draft_tokens),
            num_drafted=sum(len(d[0]) for d in drafts.values()), num_requested=k * len(decoding), k=k,
            num_with_drafts=sum(1 for d in drafts.values() if d[0]), draft_seconds=t_draft, stats=self.stats)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def set_max_model_len(self, max_model_len: int) -> None:
        """Cap the context (prompt + output) requests may use (vLLM's --max-model-len): at most the
        model's max_position_embeddings, and no more than the KV pool holds for one request."""
        context = self.model.config.max_position_embeddings
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, numbers.Integral) or max_model_len < 1:
            raise ValueError(f"max_model_len must be a positive integer, got {max_model_len!r}")
        if max_model_len > context:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's context (max_position_embeddings="
                             f"{context}): use max_model_len <= {context}")
        fits = self.pool_context_len()
        if max_model_len > fits:
            need = self.kv.blocks_for(max_model_len + self.config.num_lookahead_tokens)
            raise ValueError(f"max_model_len={max_model_len} does not fit the KV pool ({self.kv.pool.num_blocks} blocks "
                             f"of {self.kv.block_size} tokens hold one request of at most {fits} tokens): raise the "
                             f"pool to >= {need} blocks or use max_model_len <= {fits}")
        self.max_model_len = int(max_model_len)

    def pool_context_len(self) -> int:
        """The longest request (prompt + output) the whole KV pool can hold, lookahead slots included."""
        return self.kv.pool.num_blocks * self.kv.block_size - self.config.num_lookahead_tokens

    def generate(self, prompts, params: SamplingParams | list[SamplingParams], on_finish=None) -> list[Request]:
        """Run requests to completion: the one way to drive the engine (LLM, bench, lessons, tests).

        Every prompt and parameter is checked before any request is queued. If anything raises
        (a failed step, KeyboardInterrupt), exactly this call's requests are aborted (blocks freed,
        proposer state dropped) before the exception propagates.

        Args:
            prompts: token id lists.
            params: one SamplingParams for all, or one per prompt.
            on_finish: called with each list of requests that finished in a step (progress bars).
        Returns:
            The requests, in order (finished: see each one's finish_reason).
        """
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts: give one, or one per prompt")
        checked = [self.check_request(p, sp) for p, sp in zip(prompts, params)]
        requests = []
        try:
            requests = [self.add_request(p, sp) for p, sp in zip(checked, params)]
            while self.has_unfinished():
                finished = self.step()
                if on_finish is not None and finished:
                    on_finish(finished)
        except BaseException:
            self.abort([r.request_id for r in requests])
            raise
        return requests


def check_proposer(config: EngineConfig, proposer: Proposer | None) -> None:
    """ValueError unless the config and the proposer agree on k and the proposer's lookahead fits."""
    k = proposer.num_speculative_tokens if proposer else 0
    if config.num_speculative_tokens != k:
        have = f"the proposer drafts num_speculative_tokens={k}" if proposer else "there is no proposer"
        raise ValueError(f"EngineConfig.num_speculative_tokens={config.num_speculative_tokens} but {have}: both come "
                         f"from speculative_config['num_speculative_tokens']; build the EngineConfig with "
                         f"num_speculative_tokens={k}, or pass its fields to LLMEngine as keywords")
    need = proposer.num_lookahead_tokens if proposer else 0
    if config.num_lookahead_tokens < need:
        raise ValueError(f"the proposer writes {need} lookahead slots per step but num_lookahead_tokens="
                         f"{config.num_lookahead_tokens}: set num_lookahead_tokens >= {need}")


def default_num_kv_blocks(model: LlamaForCausalLM, block_size: int, max_num_seqs: int, kv_cache_gb: float) -> int:
    """Enough blocks for max_num_seqs full-context requests, capped at kv_cache_gb of cache."""
    full = math.ceil(model.config.max_position_embeddings / block_size) * max_num_seqs
    cap = int(kv_cache_gb * 2**30 // (model.kv_bytes_per_token() * block_size))
    return max(1, min(full, cap))
