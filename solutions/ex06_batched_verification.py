"""Exercise 06, solution: greedy verification of a ragged batch, in vLLM's flattened layout."""

import torch


def target_rows(num_draft_tokens: list[int]) -> tuple[list[int], list[int]]:
    """(verification rows, bonus rows) of the (T + B, V) target probabilities, like vLLM's
    target_logits_indices (T of them, request by request) and bonus_logits_indices (B of them)."""
    verify, bonus, row = [], [], 0
    for k in num_draft_tokens:
        verify += range(row, row + k)
        bonus.append(row + k)
        row += k + 1
    return verify, bonus


def greedy_verify_batch(draft_token_ids: torch.Tensor, num_draft_tokens: list[int],
                        target_probs: torch.Tensor) -> torch.Tensor:
    """Greedy verification of every request: keep drafts while each equals the argmax of its target
    row, then append the argmax of the row after the last kept draft (recovered or bonus).

    Args:
        draft_token_ids: (T,) int64, the drafts concatenated.
        num_draft_tokens: (B,) k_r >= 0.
        target_probs: (T + B, V).
    Returns:
        (B, max_k + 1) int64: each request's output, padded with -1.
    """
    ks = [int(k) for k in num_draft_tokens]
    best = target_probs.argmax(-1).tolist()  # (T + B,) the target's token at every row
    out = torch.full((len(ks), max(ks, default=0) + 1), -1, dtype=torch.int64)
    cu = 0  # first draft of request r
    for r, k in enumerate(ks):
        drafts, rows = draft_token_ids[cu:cu + k].tolist(), best[cu + r:cu + r + k + 1]
        n = 0
        while n < k and drafts[n] == rows[n]:
            n += 1
        out[r, :n + 1] = torch.tensor(drafts[:n] + [rows[n]])
        cu += k
    return out
