"""Exercise 09, solution: read acceptance off two /metrics scrapes, and choose k from a cost model.

What an operator does with `speclab serve` (or `vllm serve`): scrape the spec-decode counters, turn
two scrapes into an acceptance rate and a mean acceptance length (what PromQL's increase() does,
counter resets included), and decide how many drafts pay at the batch size the server runs.
"""

import re


SPEC = "speclab:spec_decode_"


def parse_spec_counters(text: str) -> dict:
    """The spec-decode counters in a Prometheus text scrape.

    Returns {"num_drafts": x, "num_draft_tokens": x, "num_accepted_tokens": x,
             "num_accepted_tokens_per_pos": {position (int): x}} (floats; missing counters are 0).
    Comment lines (# HELP, # TYPE), other metrics and the `_created` samples (the time each counter was
    created, which prometheus_client exports beside `_total`) are skipped; a counter exported by several
    engines (one series per `engine` label) is summed over them; labels other than `position` are ignored.
    """
    out = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0, "num_accepted_tokens_per_pos": {}}
    for line in text.splitlines():
        if not line.startswith(SPEC):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        key = name[len(SPEC):].removesuffix("_total")
        if key == "num_accepted_tokens_per_pos":
            pos = int(re.search(r'position="(\d+)"', labels).group(1))
            out[key][pos] = out[key].get(pos, 0.0) + float(value)
        elif key in out:
            out[key] += float(value)
    return out


def increase(before: float, after: float) -> float:
    """A counter's increase between two scrapes; a counter that went down was reset (the server
    restarted) and counted from 0 again, so its increase is `after` (PromQL's rule)."""
    return after - before if after >= before else after


def acceptance_between(before: dict, after: dict) -> dict:
    """Acceptance over the interval between two parsed scrapes.

    Returns {"acceptance_rate": accepted / draft tokens (0.0 without drafts),
             "mean_acceptance_length": 1 + accepted / drafts (1.0 without drafts),
             "per_position": [accepted at position i / drafts, for i = 0, 1, ...]}.
    """
    d = {k: increase(before[k], after[k]) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    positions = sorted(after["num_accepted_tokens_per_pos"])
    per_pos = [increase(before["num_accepted_tokens_per_pos"].get(i, 0.0), after["num_accepted_tokens_per_pos"][i])
               for i in positions]
    drafts = d["num_drafts"]
    return {"acceptance_rate": d["num_accepted_tokens"] / d["num_draft_tokens"] if d["num_draft_tokens"] else 0.0,
            "mean_acceptance_length": 1 + d["num_accepted_tokens"] / drafts if drafts else 1.0,
            "per_position": [a / drafts if drafts else 0.0 for a in per_pos]}


def k_for_batch_size(table: list[tuple[int, int, int]], batch_size: int, k_max: int) -> int:
    """vLLM's num_speculative_tokens_per_batch_size: inclusive (start, end, k) ranges, sorted. As vLLM
    does: a table whose first range does not start at 1 is refused (ValueError naming the fix); a batch
    size in a gap or past the last range takes the k of the range below it; a k above k_max is clamped
    to k_max."""
    if not table or table[0][0] != 1:
        raise ValueError(f"the table must start at batch size 1 (vLLM refuses it otherwise), got {table}")
    k = k_max
    for start, _end, k_range in table:
        if batch_size < start:
            break
        k = k_range
    return min(k, k_max)


def best_k(alpha: float, batch_size: int, k_max: int, target_seconds, draft_seconds) -> int:
    """The k in 0..k_max with the most tokens per second for a batch of `batch_size` requests.

    Each request drafts k tokens and keeps 1 + alpha + ... + alpha^k on average; a step costs
    target_seconds(N), N = batch_size * (k + 1) tokens verified, plus k * draft_seconds(batch_size).
    The smallest k wins ties.
    """
    def throughput(k):
        tokens = batch_size * sum(alpha ** i for i in range(k + 1))
        return tokens / (target_seconds(batch_size * (k + 1)) + k * draft_seconds(batch_size))
    return max(range(k_max + 1), key=lambda k: (throughput(k), -k))
