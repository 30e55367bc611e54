"""Exercise 06, solution: from one forward's logits to every request's greedy output, with vLLM's
SpecDecodeMetadata indices.

The target's forward runs over every scheduled token of every request: a prefill chunk of 100
tokens, a decode step's 1 + k_r tokens (the last sampled token and the drafts). Only the last
1 + k_r positions of each request need logits (`logits_indices`); among those rows, k_r verify
drafts (`target_logits_indices`) and one gives the bonus (`bonus_logits_indices`).
`cu_num_draft_tokens` is vLLM's *inclusive* cumulative sum (no leading 0).
"""

import torch


def spec_decode_indices(num_scheduled_tokens: list[int], num_draft_tokens: list[int]) -> dict[str, list[int]]:
    """vLLM's index lists for one step. Returns a dict with
    cu_num_draft_tokens (B,), logits_indices (T + B,), target_logits_indices (T,), bonus_logits_indices (B,)."""
    cu_draft, cu_sched, logits, verify, bonus = [], 0, [], [], []
    for n, k in zip(num_scheduled_tokens, num_draft_tokens):
        cu_sched += n
        logits += range(cu_sched - 1 - k, cu_sched)  # the request's last 1 + k scheduled positions
        verify += range(len(logits) - 1 - k, len(logits) - 1)
        bonus.append(len(logits) - 1)
        cu_draft.append(k + (cu_draft[-1] if cu_draft else 0))
    return {"cu_num_draft_tokens": cu_draft, "logits_indices": logits,
            "target_logits_indices": verify, "bonus_logits_indices": bonus}


def greedy_verify_batch(logits: torch.Tensor, num_scheduled_tokens: list[int], draft_token_ids: torch.Tensor,
                        num_draft_tokens: list[int]) -> torch.Tensor:
    """Greedy verification straight from the forward's logits.

    Args:
        logits: (sum(num_scheduled_tokens), V), one row per scheduled token.
        num_scheduled_tokens: (B,) tokens each request fed this step (>= 1 + k_r).
        draft_token_ids: (T,) int64, the drafts concatenated.
        num_draft_tokens: (B,) k_r >= 0.
    Returns:
        (B, max_k + 1) int64: each request's accepted drafts, then the target's token, then -1.
    """
    idx = spec_decode_indices(num_scheduled_tokens, num_draft_tokens)
    best = logits[idx["logits_indices"]].argmax(-1)  # (T + B,) the target's token at every needed row
    k = torch.tensor(num_draft_tokens, dtype=torch.int64)
    B, max_k = len(num_draft_tokens), max(num_draft_tokens, default=0)
    start = torch.tensor(idx["bonus_logits_indices"], dtype=torch.int64) - k  # (B,) first row of each request
    pos = torch.arange(max_k + 1)  # (max_k + 1,)
    rows = (start[:, None] + pos).clamp(max=best.numel() - 1)  # (B, max_k + 1)
    cu = torch.tensor(idx["cu_num_draft_tokens"], dtype=torch.int64) - k  # exclusive: first draft of each request
    drafts = draft_token_ids[(cu[:, None] + pos[:max_k]).clamp(max=max(draft_token_ids.numel() - 1, 0))] \
        if max_k else torch.empty(B, 0, dtype=torch.int64)  # (B, max_k)
    match = (drafts == best[rows[:, :max_k]]) & (pos[:max_k] < k[:, None])
    n = match.long().cumprod(1).sum(1)  # (B,) accepted drafts
    return torch.where(pos <= n[:, None], best[rows], -1)
