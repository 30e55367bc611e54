"""`speculative_config`: the same JSON keys as vLLM's --speculative-config, and vLLM's checks.

    LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 5,
                            "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    LLM(speculative_config={"method": "draft_model", "model": "draft", "num_speculative_tokens": 4})
    LLM(speculative_config={"method": "eagle", "model": "eagle", "num_speculative_tokens": 4})
    LLM("smollm2", speculative_config={"method": "eagle", "model": "eagle-smollm2", "num_speculative_tokens": 4})

Head methods ("eagle", "eagle3", "mtp", "medusa"; lesson 08) take a head directory or the name of a
shipped head as `model`; without one, speclab picks the head it ships for the target (vLLM does that
for mtp only, whose weights live in the target's checkpoint).
"""

from dataclasses import dataclass, fields

HEAD_METHODS = ("eagle", "eagle3", "mtp", "medusa")
METHODS = ("ngram", "draft_model") + HEAD_METHODS
NOT_YET = ("mlp_speculator", "suffix", "ngram_gpu", "dflash")
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


@dataclass
class SpeculativeConfig:
    """Attributes (vLLM's names):
        method: "ngram", "draft_model", or a head method "eagle", "eagle3", "mtp", "medusa"
            (inferred from `model` when missing, as vLLM does).
        num_speculative_tokens: k > 0, drafts per step.
        model: the draft model (draft_model): a directory, a hub id, or "draft" (the embedded draft);
            a head (head methods): its directory or a shipped head's name (None: the target's own).
        prompt_lookup_max, prompt_lookup_min: n-gram sizes (ngram); one set copies to the other.
        draft_sample_method: "greedy" (argmax drafts, q treated as one-hot, vLLM's default) or
            "probabilistic" (drafts sampled from q, q kept for verification: higher acceptance at T > 0).
    """

    method: str | None = None
    num_speculative_tokens: int | None = None
    model: str | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    draft_sample_method: str = "greedy"

    @classmethod
    def from_dict(cls, d: dict) -> "SpeculativeConfig":
        if not isinstance(d, dict):
            raise TypeError(f"speculative_config must be a dict of vLLM's keys, got {type(d).__name__}")
        valid = [f.name for f in fields(cls)]
        if "tensor_parallel_size" in d:
            raise ValueError("'tensor_parallel_size' is not a valid argument in the speculative_config "
                             "(vLLM takes 'draft_tensor_parallel_size'; speclab runs on one device)")
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(f"unknown speculative_config key(s) {unknown}: valid keys are {valid}")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.method is None:  # vLLM infers it from the model
            if self.model in ("ngram", "[ngram]"):
                self.method, self.model = "ngram", None
            elif self.model is not None:
                self.method = _head_method(self.model) or "draft_model"
            else:
                raise ValueError("speculative_config needs 'method' (one of ngram, draft_model) or a draft 'model'")
        if self.method in NOT_YET:
            raise NotImplementedError(f"speculative method {self.method!r} is not implemented in speclab yet: "
                                      f"use one of {METHODS}")
        if self.method not in METHODS:
            raise NotImplementedError(f"Unsupported speculative method: {self.method!r} (choose one of {METHODS})")
        if self.num_speculative_tokens is None:
            raise ValueError("num_speculative_tokens must be provided (the number of drafts per step, e.g. 4)")
        if isinstance(self.num_speculative_tokens, bool) or not isinstance(self.num_speculative_tokens, int) \
                or self.num_speculative_tokens <= 0:
            raise ValueError(f"Expected num_speculative_tokens to be greater than zero ({self.num_speculative_tokens})")
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise ValueError(f"draft_sample_method must be one of {DRAFT_SAMPLE_METHODS}, got {self.draft_sample_method!r}")
        if self.method == "ngram":
            self._validate_ngram()
        elif self.method == "draft_model" and self.model is None:
            raise ValueError("method 'draft_model' needs a draft 'model' (a directory, a hub id, or 'draft' for "
                             "the embedded draft)")

    def _validate_ngram(self) -> None:
        if self.model is not None:
            raise ValueError("method 'ngram' takes no 'model': drafts come from the context itself")
        if self.prompt_lookup_max is None and self.prompt_lookup_min is None:
            self.prompt_lookup_max = self.prompt_lookup_min = 5  # vLLM's default when both are unset
        if self.prompt_lookup_max is None:  # vLLM: one given, the other copies it
            self.prompt_lookup_max = self.prompt_lookup_min
        if self.prompt_lookup_min is None:
            self.prompt_lookup_min = self.prompt_lookup_max
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if isinstance(getattr(self, key), bool) or not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {getattr(self, key)!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} must be <= "
                             f"prompt_lookup_max={self.prompt_lookup_max}")


def _head_method(model) -> str | None:
    """The method of a head directory or shipped head name (vLLM infers it from the draft's config)."""
    from speclab.models.heads import head_method
    return head_method(model)
