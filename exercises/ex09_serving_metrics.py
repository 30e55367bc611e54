"""Exercise 09: read acceptance off two /metrics scrapes, and choose k from a cost model.

Lesson 09 serves the model, scrapes `speclab:spec_decode_*` and charts acceptance with PromQL. Here
you do what PromQL and an operator do: parse a scrape, turn two scrapes into the acceptance rate
(accepted / draft tokens) and the mean acceptance length (1 + accepted / drafts), counter resets
included, read vLLM's k-by-batch-size table, and pick the k that a cost model says is fastest.
Fill in the five functions, then grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex09_serving_metrics.py
Lessons: notebooks/09_serving.ipynb (and 02 for the cost model).
"""

import re  # noqa: F401  (yours to use)

SPEC = "speclab:spec_decode_"


def parse_spec_counters(text: str) -> dict:
    """The spec-decode counters in a Prometheus text scrape.

    Returns {"num_drafts": x, "num_draft_tokens": x, "num_accepted_tokens": x,
             "num_accepted_tokens_per_pos": {position (int): x}} (floats; missing counters are 0).
    Comment lines (# HELP, # TYPE), other metrics and the `_created` samples (the time each counter was
    created, which prometheus_client exports beside `_total`) are skipped; a counter exported by several
    engines (one series per `engine` label) is summed over them; labels other than `position` are ignored.
    """
    raise NotImplementedError("TODO(ex09): ~12 lines: keep lines starting with SPEC, split name{labels} value, sum by key")


def increase(before: float, after: float) -> float:
    """A counter's increase between two scrapes; a counter that went down was reset (the server
    restarted) and counted from 0 again, so its increase is `after` (PromQL's rule)."""
    raise NotImplementedError("TODO(ex09): 1 line: what does a counter that went down mean?")


def acceptance_between(before: dict, after: dict) -> dict:
    """Acceptance over the interval between two parsed scrapes.

    Returns {"acceptance_rate": accepted / draft tokens (0.0 without drafts),
             "mean_acceptance_length": 1 + accepted / drafts (1.0 without drafts),
             "per_position": [accepted at position i / drafts, for i = 0, 1, ...]}.
    """
    raise NotImplementedError("TODO(ex09): ~8 lines: increases of the counters, then two ratios and a list; mind zero drafts")


def k_for_batch_size(table: list[tuple[int, int, int]], batch_size: int, k_max: int) -> int:
    """vLLM's num_speculative_tokens_per_batch_size: inclusive (start, end, k) ranges, sorted. As vLLM
    does: a table whose first range does not start at 1 is refused (ValueError naming the fix); a batch
    size in a gap or past the last range takes the k of the range below it; a k above k_max is clamped
    to k_max."""
    raise NotImplementedError("TODO(ex09): ~7 lines: refuse a first range not at 1; walk the sorted ranges; gaps inherit the range below; clamp")


def best_k(alpha: float, batch_size: int, k_max: int, target_seconds, draft_seconds) -> int:
    """The k in 0..k_max with the most tokens per second for a batch of `batch_size` requests.

    Each request drafts k tokens and keeps 1 + alpha + ... + alpha^k on average; a step costs
    target_seconds(N), N = batch_size * (k + 1) tokens verified, plus k * draft_seconds(batch_size).
    The smallest k wins ties.
    """
    raise NotImplementedError("TODO(ex09): ~4 lines: tokens per step / seconds per step for every k; smallest k on ties")
