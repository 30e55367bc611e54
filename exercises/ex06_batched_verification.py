"""Exercise 06: from one forward's logits to every request's greedy output, with vLLM's
SpecDecodeMetadata indices.

Lesson 06 starts from target_probs that already hold exactly k_r + 1 rows per request. The runner
starts earlier: the target's forward returns one logits row per *scheduled* token, and a step mixes
prefill chunks (a request feeding 100 prompt tokens, k = 0) with decode steps (1 + k_r tokens: the
last sampled token and the drafts). Work out vLLM's indices (gpu_model_runner builds them into
SpecDecodeMetadata; cu_num_draft_tokens is an *inclusive* cumulative sum, no leading 0):
    logits_indices         the rows of the forward that need logits: each request's last 1 + k_r positions
    target_logits_indices  among those selected rows, the k_r that verify drafts, request by request
    bonus_logits_indices   among those selected rows, each request's bonus row
then verify greedily from the logits. Vectorising greedy_verify_batch (no loop over requests) is the
stretch goal. Fill in both functions, then grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex06_batched_verification.py
Lesson: notebooks/06_batched_verification.ipynb.
"""


import torch


def spec_decode_indices(num_scheduled_tokens: list[int], num_draft_tokens: list[int]) -> dict[str, list[int]]:
    """vLLM's index lists for one step. Returns a dict with
    cu_num_draft_tokens (B,), logits_indices (T + B,), target_logits_indices (T,), bonus_logits_indices (B,)."""
    raise NotImplementedError("TODO(ex06): 8-10 lines: walk the requests with two running offsets (scheduled tokens, selected rows)")


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
    raise NotImplementedError("TODO(ex06): 8-14 lines: select rows with logits_indices, argmax, then the leading-match run per request")
