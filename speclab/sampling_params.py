"""SamplingParams: how one request is sampled, shaped like vLLM's."""

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Per-request sampling settings (vLLM's names and defaults where they overlap).

    Attributes:
        temperature: 0 means greedy.
        top_p: nucleus mass in (0, 1]; 1 disables.
        top_k: keep the k most likely tokens; 0 or -1 disables.
        max_tokens: generated tokens at most.
        seed: per-request seed; the same seed gives the same output alone or in any batch.
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
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or a positive count, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
