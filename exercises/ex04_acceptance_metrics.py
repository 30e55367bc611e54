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
    num_accepted of them accepted. A step with no drafts is not a draft and changes nothing.
    Besides vLLM's counters, count num_positions_tested: min(num_accepted + 1, num_draft_tokens)."""
    raise NotImplementedError("TODO(ex04): 6-7 lines: four sums and one loop over accepted positions")


def acceptance_rate(counters: dict) -> float:
    """vLLM's acceptance rate: accepted draft tokens / draft tokens (0.0 when nothing was drafted)."""
    raise NotImplementedError("TODO(ex04): 1-2 lines")


def mean_acceptance_length(counters: dict) -> float:
    """Tokens per verification step, the recovered or bonus token included: 1 + accepted / drafts
    (1.0 when there were no drafts)."""
    raise NotImplementedError("TODO(ex04): 1-2 lines")


def alpha(counters: dict) -> float:
    """Leviathan's alpha: accepted / positions *tested* (counted by observe: a step that accepts a of
    k drafts tested min(a + 1, k) positions, since verification stops at the first rejection)."""
    raise NotImplementedError("TODO(ex04): 2 lines: accepted / positions tested")
