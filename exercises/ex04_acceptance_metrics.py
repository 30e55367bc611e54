"""Exercise 04: vLLM's speculative-decoding counters, and the rates derived from them.

The counters are a dict with vLLM's names (prefixed `spec_decode_` in its metrics):
    {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
     "num_accepted_tokens_per_pos": [0] * k}        # k = num_speculative_tokens
Fill in the four functions, then grade yourself:
    pytest --impl=exercises tests/test_ex04_acceptance_metrics.py
Lesson: notebooks/04_draft_models.ipynb (and 02 for alpha).
"""


def observe(counters: dict, num_draft_tokens: int, num_accepted: int) -> None:
    """Record one verification of one request in place: num_draft_tokens drafted, the first
    num_accepted of them accepted. A step with no drafts is not a draft and changes nothing."""
    raise NotImplementedError("TODO(ex04): 5-6 lines: three sums and one loop over accepted positions")


def acceptance_rate(counters: dict) -> float:
    """vLLM's acceptance rate: accepted draft tokens / draft tokens (0.0 when nothing was drafted)."""
    raise NotImplementedError("TODO(ex04): 1-2 lines")


def mean_acceptance_length(counters: dict) -> float:
    """Tokens per verification step, the recovered or bonus token included: 1 + accepted / drafts
    (1.0 when there were no drafts)."""
    raise NotImplementedError("TODO(ex04): 1-2 lines")


def alpha(counters: dict) -> float:
    """Leviathan's alpha: accepted / positions *tested*. Every draft tests position 0; an acceptance
    at position i tests position i + 1 (as the counters assume, every draft had the full k)."""
    raise NotImplementedError("TODO(ex04): 2-3 lines: count the tested positions from the per-position counts")
