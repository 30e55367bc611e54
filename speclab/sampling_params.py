"""SamplingParams: how one request is sampled, shaped like vLLM's.

Checked when made and again when a request is queued (a script may change a field in between),
with vLLM's messages; nothing is silently coerced. The checks use the form the engine computes
in: temperature and top_p become float32 rows of the sampler's tensors, top_k and seeds int64, so
a value that passes here can never overflow (or round to 0) inside a step. Each request keeps its
own copy, so changing a SamplingParams later never reaches a request already queued.
"""

import copy
import math
import numbers
from dataclasses import dataclass, field

from speclab.sampling import SAMPLING_EPS  # below it a request is greedy, as in vLLM

FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max: temperature rows are float32
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32: a top_p below it rounds toward 0
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # seeds and top_k are int64 in the engine (as in vLLM)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass
class SamplingParams:
    """Per-request sampling settings (vLLM's names and defaults where they overlap).

    Attributes:
        temperature: 0 (or below 1e-5) means greedy; at most float32's max (3.4e38).
        top_p: nucleus mass in (0, 1]; 1 disables; at least float32's smallest normal number (1.2e-38).
        top_k: keep the k most likely tokens; 0 or -1 disables, and so does k >= the vocabulary
            (as in vLLM: a queued request keeps top_k = 0 then).
        max_tokens: generated tokens at most.
        seed: per-request seed, any int64 (negative ones too, as vLLM accepts). The same seed gives
            the same output alone or in any batch, with or without preemption, whatever was drafted
            (exact in float32; other dtypes can change a token through batch-shape numerics).
        stop_token_ids: tokens that end the request (kept in the output, as vLLM does for ids); any
            iterable is copied into a list when made.
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
        elif not isinstance(self.stop_token_ids, (str, bytes, dict)) and hasattr(self.stop_token_ids, "__iter__"):
            self.stop_token_ids = list(self.stop_token_ids)  # an iterator is read once, here (not by validate)
        self.validate()

    def validate(self) -> None:
        """Raise ValueError (vLLM's wording where it has one) for any field out of range or of the wrong type."""
        problem = self.problem()
        if problem is not None:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """The first field out of range, as a message naming the field and the fix; None when all are fine."""
        t, p = self.temperature, self.top_p
        if not _is_real(t) or not math.isfinite(t):
            return f"temperature must be a finite number, got {t!r}"
        if t < 0:
            return f"temperature must be non-negative, got {t}"
        if t > FLOAT32_MAX:
            return (f"temperature={t!r} overflows float32 (the sampler's dtype, max 3.4e38): use a temperature "
                    f"below that (any temperature above ~1e3 already samples almost uniformly)")
        if not _is_real(p) or not math.isfinite(p) or not 0 < p <= 1:
            return f"top_p must be in (0, 1], got {p!r}"
        if p < FLOAT32_TINY:
            return (f"top_p={p!r} rounds to 0 in float32 (the sampler's dtype): use top_p >= 1.2e-38 (any top_p "
                    f"that small keeps only the most likely token, e.g. top_p=1e-6 or top_k=1)")
        if not _is_int(self.top_k) or self.top_k < -1:
            return f"top_k must be 0 or -1 (disable), or at least 1, got {self.top_k!r}"
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            return f"max_tokens must be at least 1, got {self.max_tokens!r}"
        if self.seed is not None and (not _is_int(self.seed) or not INT64_MIN <= self.seed <= INT64_MAX):
            return f"seed must be an integer in the int64 range [-2**63, 2**63 - 1] or None, got {self.seed!r}"
        if not isinstance(self.stop_token_ids, (list, tuple)) \
                or not all(_is_int(t) and 0 <= t <= INT64_MAX for t in self.stop_token_ids):
            return (f"stop_token_ids must be a list of non-negative integer token ids, got "
                    f"{self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool):
            return f"ignore_eos must be True or False, got {self.ignore_eos!r}"
        return None

    def engine_problem(self) -> str | None:
        """`problem()`, plus what only a queued request must satisfy: top_k within int64 (a queued copy
        holds top_k < vocabulary, see `for_vocab`). The runner asks this of every request it samples, so
        a field changed behind the engine's back fails that request alone, never the whole step."""
        problem = self.problem()
        if problem is None and self.top_k > INT64_MAX:
            return f"top_k={self.top_k} overflows int64: a queued request's top_k is below its vocabulary size"
        return problem

    def for_vocab(self, vocab_size: int) -> "SamplingParams":
        """The validated copy a queued request keeps: top_k >= vocab_size means "disabled" (vLLM's rule), so
        it is stored as 0 and every top_k the engine meets fits in int64."""
        params = self.clone()
        if params.top_k >= vocab_size:
            params.top_k = 0
        return params

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    def clone(self) -> "SamplingParams":
        """A validated deep copy (what a queued request keeps)."""
        self.validate()
        return copy.deepcopy(self)
