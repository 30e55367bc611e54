"""Exercise 11, solution: four interview code drills, each small enough for a whiteboard.

1. `verify_step`: one sequence's verification from memory, deterministic given its uniforms and
   one Exp(1) noise row (the exponential race), so it can be checked token for token against
   `speclab.verify.rejection_sample` (lessons 01, 06, 07).
2. `spec_decode_indices`: vLLM's ragged index arithmetic, from the scheduled tokens and drafts of a
   batch to the rows of the logits that verify drafts and the rows that give bonus tokens (lesson 06).
3. `dashboard`: three PromQL panels on vLLM's spec-decode counters (lesson 09).
4. `k_table`: vLLM's `num_speculative_tokens_per_batch_size` table from a cost curve (lessons 02, 09).
"""

import torch


def verify_step(draft_tokens: list[int], p: torch.Tensor, q: torch.Tensor | None,
                uniforms: torch.Tensor, noise: torch.Tensor) -> list[int]:
    """The tokens one verification step appends: accepted drafts, then one recovered or bonus token.

    Args:
        draft_tokens: k draft ids.
        p: (k + 1, V) target probabilities (k verification rows, then the bonus row).
        q: (k, V) draft probabilities, or None for one-hot drafts (n-gram, argmax drafters).
        uniforms: (k,) float64 in (0, 1): draft i is accepted iff q_i(x) > 0 and p_i(x) / q_i(x) >= u_i.
        noise: (V,) Exp(1): the final token is argmax_v r(v) / noise(v), with r = max(p_n - q_n, 0)
            at a rejection at position n (p_n itself when that residual is all zero), or p_k for the bonus.
    Returns:
        1..k + 1 token ids.
    """
    out = []
    for i, x in enumerate(draft_tokens):
        q_x = 1.0 if q is None else float(q[i, x])
        if q_x > 0 and float(p[i, x]) / q_x >= float(uniforms[i]):
            out.append(int(x))
            continue
        q_i = torch.zeros_like(p[i]) if q is None else q[i]
        if q is None:
            q_i[x] = 1.0
        r = (p[i] - q_i).clamp(min=0)
        if float(r.max()) <= 0:
            r = p[i]
        return out + [int((r / noise).argmax())]
    return out + [int((p[len(draft_tokens)] / noise).argmax())]


def spec_decode_indices(cu_num_scheduled_tokens: list[int], num_draft_tokens: list[int]) -> dict:
    """vLLM's `SpecDecodeMetadata` indices for one step.

    Request r was scheduled tokens [cu[r-1], cu[r]) of the flattened batch (cu inclusive: no leading
    0), the last num_draft_tokens[r] of them its drafts. The target computes logits for each request's
    last 1 + k_r rows: k_r rows verify its drafts, the last one gives its bonus token.

    Returns (lists of ints):
        "cu_num_draft_tokens": inclusive cumulative sum of num_draft_tokens;
        "logits_indices": rows of the forward whose logits are needed (B + sum k of them);
        "target_logits_indices": positions *within logits_indices* that verify drafts (sum k);
        "bonus_logits_indices": positions within logits_indices of each request's bonus row (B).
    """
    cu_draft, logits, target, bonus = [], [], [], []
    total = 0
    for cu, k in zip(cu_num_scheduled_tokens, num_draft_tokens):
        total += k
        cu_draft.append(total)
        start = len(logits)
        logits += list(range(cu - 1 - k, cu))
        target += list(range(start, start + k))
        bonus.append(start + k)
    return {"cu_num_draft_tokens": cu_draft, "logits_indices": logits,
            "target_logits_indices": target, "bonus_logits_indices": bonus}


def dashboard(prefix: str = "vllm:", window: str = "5m") -> dict:
    """Three PromQL expressions for a speculative-decoding dashboard, over `window`, summed over every
    engine (and model) series the server exports.

    Returns {"acceptance_rate": accepted / draft tokens (one series),
             "mean_acceptance_length": 1 + accepted / drafts (one series),
             "acceptance_by_position": accepted at position i / drafts (one series per `position` label)}.
    """
    def r(name):
        return f"rate({prefix}spec_decode_{name}_total[{window}])"
    drafts = f"sum({r('num_drafts')})"
    return {"acceptance_rate": f"sum({r('num_accepted_tokens')}) / sum({r('num_draft_tokens')})",
            "mean_acceptance_length": f"1 + sum({r('num_accepted_tokens')}) / {drafts}",
            "acceptance_by_position": f"sum by (position) ({r('num_accepted_tokens_per_pos')}) "
                                      f"/ ignoring(position) group_left {drafts}"}


def k_table(alpha: float, k_max: int, max_batch_size: int, target_seconds, draft_seconds) -> list[tuple[int, int, int]]:
    """vLLM's num_speculative_tokens_per_batch_size for batch sizes 1..max_batch_size.

    For each batch size B, the best k in 0..k_max maximises B * (1 + alpha + ... + alpha^k) tokens per
    step over target_seconds(B * (k + 1)) + k * draft_seconds(B) seconds (the smallest k on ties).
    Returns inclusive (start, end, k) ranges, sorted, starting at 1 and ending at max_batch_size,
    with no gaps and adjacent ranges of equal k merged.
    """
    def best(B):
        tput = [B * sum(alpha ** i for i in range(k + 1)) / (target_seconds(B * (k + 1)) + k * draft_seconds(B))
                for k in range(k_max + 1)]
        return max(range(k_max + 1), key=lambda k: (tput[k], -k))
    table = []
    for B in range(1, max_batch_size + 1):
        k = best(B)
        if table and table[-1][2] == k:
            table[-1] = (table[-1][0], B, k)
        else:
            table.append((B, B, k))
    return table
