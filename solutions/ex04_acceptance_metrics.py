"""Exercise 04, solution: vLLM's speculative-decoding counters, and the rates derived from them."""


def observe(counters: dict, num_draft_tokens: int, num_accepted: int) -> None:
    """Record one verification of one request in place: num_draft_tokens drafted, the first
    num_accepted of them accepted. A step with no drafts is not a draft and changes nothing.
    Besides vLLM's counters, count num_positions_tested: min(num_accepted + 1, num_draft_tokens)."""
    if num_draft_tokens == 0:
        return
    counters["num_drafts"] += 1
    counters["num_draft_tokens"] += num_draft_tokens
    counters["num_accepted_tokens"] += num_accepted
    counters["num_positions_tested"] += min(num_accepted + 1, num_draft_tokens)
    for i in range(num_accepted):
        counters["num_accepted_tokens_per_pos"][i] += 1


def acceptance_rate(counters: dict) -> float:
    """vLLM's acceptance rate: accepted draft tokens / draft tokens (0.0 when nothing was drafted)."""
    drafted = counters["num_draft_tokens"]
    return counters["num_accepted_tokens"] / drafted if drafted else 0.0


def mean_acceptance_length(counters: dict) -> float:
    """Tokens per verification step, the recovered or bonus token included: 1 + accepted / drafts
    (1.0 when there were no drafts)."""
    drafts = counters["num_drafts"]
    return 1 + counters["num_accepted_tokens"] / drafts if drafts else 1.0


def alpha(counters: dict) -> float:
    """Leviathan's alpha: accepted / positions *tested* (counted by observe: a step that accepts a of
    k drafts tested min(a + 1, k) positions, since verification stops at the first rejection)."""
    tested = counters["num_positions_tested"]
    return counters["num_accepted_tokens"] / tested if tested else 0.0
