"""Exercise 06: greedy verification of a ragged batch, in vLLM's flattened layout.

Request r drafted k_r tokens. Its drafts are rows [cu_r, cu_r + k_r) of the concatenated drafts
(cu_r = k_0 + ... + k_{r-1}); its target rows are [cu_r + r, cu_r + r + k_r]: k_r verification
rows, then one bonus row. Fill in both functions, then grade yourself:
    pytest --impl=exercises tests/test_ex06_batched_verification.py
Lesson: notebooks/06_batched_verification.ipynb.
"""

import torch


def target_rows(num_draft_tokens: list[int]) -> tuple[list[int], list[int]]:
    """(verification rows, bonus rows) of the (T + B, V) target probabilities, like vLLM's
    target_logits_indices (T of them, request by request) and bonus_logits_indices (B of them)."""
    raise NotImplementedError("TODO(ex06): 6-8 lines: walk the requests with a running row offset")


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
    raise NotImplementedError("TODO(ex06): 10-14 lines: a loop over requests is fine")
