"""A request as the engine tracks it: its tokens, how many have KV in the cache, its drafts.

Only the scheduler changes a request's state (vLLM v1's ownership): it admits, preempts, commits
each step's tokens, rolls `num_computed_tokens` back past rejected drafts, and finishes it.
"""

import enum
from dataclasses import dataclass, field

import torch

from speclab.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


FINISH_REASONS = ("stop", "length", "abort", "error")


class RequestFailedError(RuntimeError):
    """Some requests of a batch failed (finish_reason "error"); `outputs` holds every request's output,
    the ones that finished included, so that one bad request never costs the others their results."""

    def __init__(self, message: str, outputs: list):
        super().__init__(message)
        self.outputs = outputs


@dataclass
class Request:
    """One prompt being generated.

    Attributes:
        num_computed_tokens: tokens whose keys and values are in the cache. The tokens after them
            (the last sampled token, the rest of a chunked prompt) are fed at the next step.
        spec_token_ids: drafts proposed for the next step, verified by the target then.
        spec_draft_probs: (k, V) q rows of those drafts, or None when they are one-hot (argmax/n-gram).
        spec_tree: the shape of the drafts when they form a tree (speclab.verify.tree.TokenTree: node i + 1
            is spec_token_ids[i]); None for a chain.
        finish_reason: "stop", "length", "abort" (cancelled) or "error" (see `error`).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)
    spec_draft_probs: torch.Tensor | None = None
    spec_tree: object = None
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    error: str | None = None
    num_preemptions: int = 0
    stop_set: frozenset = field(init=False, repr=False)  # params.stop_token_ids, for an O(1) check per token

    def __post_init__(self):
        self.stop_set = frozenset(self.params.stop_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_tokens(self, tokens: list[int], eos_token_id: int | None) -> None:
        """Append sampled tokens, stopping at a stop token, EOS or max_tokens."""
        p = self.params
        for t in tokens:
            self.output_token_ids.append(t)
            if t in self.stop_set or (t == eos_token_id and not p.ignore_eos):
                self.finish("stop")
                return
            if len(self.output_token_ids) >= p.max_tokens:
                self.finish("length")
                return

    def finish(self, reason: str, error: str | None = None) -> None:
        if reason not in FINISH_REASONS:
            raise ValueError(f"unknown finish reason {reason!r}: one of {FINISH_REASONS}")
        self.status, self.finish_reason, self.error = RequestStatus.FINISHED, reason, error
        self.spec_token_ids, self.spec_draft_probs, self.spec_tree = [], None, None
