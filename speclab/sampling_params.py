"""SamplingParams: how one request is sampled, shaped like vLLM's.

Checked when made and again when a request is queued (a script may change a field in between),
with vLLM's messages; nothing is silently coerced. Each request keeps its own copy, so changing a
SamplingParams later never reaches a request already queued.
"""

import copy
import math
import numbers
from dataclasses import dataclass, field

from speclab.sampling import SAMPLING_EPS  # below it a request is greedy, as in vLLM


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass
class SamplingParams:
    """Per-request sampling settings (vLLM's names and defaults where they overlap).

    Attributes:
        temperature: 0 (or below 1e-5) means greedy.
        top_p: nucleus mass in (0, 1]; 1 disables.
        top_k: keep the k most likely tokens; 0 or -1 disables.
        max_tokens: generated tokens at most.
        seed: per-request seed. The same seed gives the same output alone or in any batch, with or
            without preemption, whatever was drafted (exact in float32; other dtypes can change a
            token through batch-shape numerics).
        stop_token_ids: tokens that end the request (kept in the output, as vLLM does for ids).
        ignore_eos: keep going past the model's EOS token.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        self.validate()

    def validate(self) -> None:
        """Raise ValueError (vLLM's wording where it has one) for any field out of range or of the wrong type."""
        if not _is_real(self.temperature) or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be 0 or -1 (disable), or at least 1, got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens!r}")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {self.seed!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__") \
                or not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be a list of non-negative integer token ids, got "
                             f"{self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    def clone(self) -> "SamplingParams":
        """A validated deep copy (what a queued request keeps)."""
        self.validate()
        return copy.deepcopy(self)
