"""Exercise 04, solution: greedy or probabilistic drafting, and vLLM's counters for drafters
whose drafts vary in length.

Drafting (lesson 04): greedy drafts are argmax q and the verifier treats them as one-hot (q is not
passed); probabilistic drafts are sampled from q and q is kept for verification. Both are exact;
their acceptance differs: p(argmax q) against sum min(p, q).

Counters (vLLM's v1/spec_decode/metrics.py, newer versions): besides num_drafts, num_draft_tokens,
num_accepted_tokens and num_accepted_tokens_per_pos, num_draft_tokens_per_pos counts how many drafts
reached each position, so a per-position rate is accepted_per_pos / draft_tokens_per_pos and short
drafts no longer drag later positions down.
"""

import torch


def draft(draft_model, tokens: list[int], k: int, sample_method: str = "greedy",
          generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor | None]:
    """Draft k tokens after `tokens`. Returns (drafts, q): q is the (k, V) stack of the draft's
    distributions for probabilistic drafting, None for greedy drafting (drafts are one-hot)."""
    ctx, drafts, q = list(tokens), [], []
    for _ in range(k):
        q_i = draft_model(ctx)
        x = int(q_i.argmax()) if sample_method == "greedy" else int(torch.multinomial(q_i, 1, generator=generator))
        drafts.append(x)
        q.append(q_i)
        ctx.append(x)
    if sample_method == "greedy" or not q:
        return drafts, None
    return drafts, torch.stack(q)


def observe(counters: dict, num_draft_tokens: int, num_accepted: int) -> None:
    """Record one verification of one request in place: num_draft_tokens drafted, the first
    num_accepted accepted. A step with no drafts is not a draft and changes nothing."""
    if num_draft_tokens == 0:
        return
    counters["num_drafts"] += 1
    counters["num_draft_tokens"] += num_draft_tokens
    counters["num_accepted_tokens"] += num_accepted
    counters["num_positions_tested"] += min(num_accepted + 1, num_draft_tokens)
    for i in range(num_draft_tokens):
        counters["num_draft_tokens_per_pos"][i] += 1
        counters["num_accepted_tokens_per_pos"][i] += i < num_accepted


def acceptance_rate(counters: dict) -> float:
    """vLLM's acceptance rate: accepted draft tokens / draft tokens (0.0 when nothing was drafted)."""
    drafted = counters["num_draft_tokens"]
    return counters["num_accepted_tokens"] / drafted if drafted else 0.0


def mean_acceptance_length(counters: dict) -> float:
    """1 + accepted / drafts: tokens per verification step, recovered or bonus included (1.0 if none)."""
    drafts = counters["num_drafts"]
    return 1 + counters["num_accepted_tokens"] / drafts if drafts else 1.0


def acceptance_per_pos(counters: dict) -> list[float]:
    """Per position i: accepted at i / drafts that had a token at i (0.0 where none had)."""
    return [a / d if d else 0.0 for a, d in zip(counters["num_accepted_tokens_per_pos"],
                                                counters["num_draft_tokens_per_pos"])]


def alpha(counters: dict) -> float:
    """Leviathan's alpha: accepted / positions tested (a step accepting a of k tested min(a + 1, k))."""
    tested = counters["num_positions_tested"]
    return counters["num_accepted_tokens"] / tested if tested else 0.0
