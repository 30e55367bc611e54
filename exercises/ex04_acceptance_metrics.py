"""Exercise 04: greedy or probabilistic drafting, and vLLM's counters for drafters whose drafts
vary in length.

Lesson 04 runs both drafting methods through the engine and reads SpecDecodingStats; here you write
the drafting and the counters. Greedy drafts are argmax q and the verifier is told they are one-hot
(q = None); probabilistic drafts are sampled from q and q goes to the verifier. The counters are a dict
with vLLM's names, including the newer per-position draft count:
    {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
     "num_accepted_tokens_per_pos": [0] * k, "num_draft_tokens_per_pos": [0] * k,
     "num_positions_tested": 0}          # the last is not vLLM's: it gives Leviathan's alpha
Fill in the six functions, then grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex04_acceptance_metrics.py
Lessons: notebooks/04_draft_models.ipynb (and 02 for alpha).
"""


import torch


def draft(draft_model, tokens: list[int], k: int, sample_method: str = "greedy",
          generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor | None]:
    """Draft k tokens after `tokens`. Returns (drafts, q): q is the (k, V) stack of the draft's
    distributions for probabilistic drafting, None for greedy drafting (drafts are one-hot)."""
    raise NotImplementedError("TODO(ex04): ~10 lines: the draft loop of lesson 02, with argmax or a sample; what do you hand the verifier?")


def observe(counters: dict, num_draft_tokens: int, num_accepted: int) -> None:
    """Record one verification of one request in place: num_draft_tokens drafted, the first
    num_accepted accepted. A step with no drafts is not a draft and changes nothing."""
    raise NotImplementedError("TODO(ex04): 8 lines: four sums, then one loop over the drafted positions")


def acceptance_rate(counters: dict) -> float:
    """vLLM's acceptance rate: accepted draft tokens / draft tokens (0.0 when nothing was drafted)."""
    raise NotImplementedError("TODO(ex04): 1-2 lines")


def mean_acceptance_length(counters: dict) -> float:
    """1 + accepted / drafts: tokens per verification step, recovered or bonus included (1.0 if none)."""
    raise NotImplementedError("TODO(ex04): 1-2 lines")


def acceptance_per_pos(counters: dict) -> list[float]:
    """Per position i: accepted at i / drafts that had a token at i (0.0 where none had)."""
    raise NotImplementedError("TODO(ex04): 1-2 lines: divide by the drafts that reached the position, not by num_drafts")


def alpha(counters: dict) -> float:
    """Leviathan's alpha: accepted / positions tested (a step accepting a of k tested min(a + 1, k))."""
    raise NotImplementedError("TODO(ex04): 2 lines: accepted / positions tested")
