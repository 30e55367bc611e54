"""Exercise 11: four interview code drills, each small enough for a whiteboard.

Set a timer (the lesson suggests one per drill), write each from memory, then grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex11_interview_drills.py
1. `verify_step`: one sequence's verification, deterministic given its uniforms and one Exp(1) noise
   row (the exponential race), checked token for token against `speclab.verify.rejection_sample`.
2. `spec_decode_indices`: vLLM's ragged index arithmetic (lesson 06).
3. `dashboard`: three PromQL panels on vLLM's spec-decode counters (lesson 09); the grader evaluates
   your PromQL on two scrapes of a two-engine server.
4. `k_table`: vLLM's `num_speculative_tokens_per_batch_size` table from a cost curve (lessons 02, 09).
Lesson: notebooks/11_interview_review.ipynb.
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
    raise NotImplementedError("TODO(ex11): ~14 lines: accept while p/q >= u; race the residual (or p_k) against the noise")


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
    raise NotImplementedError("TODO(ex11): ~12 lines: one pass over the requests, keeping a running count of logits rows")


def dashboard(prefix: str = "vllm:", window: str = "5m") -> dict:
    """Three PromQL expressions for a speculative-decoding dashboard, over `window`, summed over every
    engine (and model) series the server exports.

    Returns {"acceptance_rate": accepted / draft tokens (one series),
             "mean_acceptance_length": 1 + accepted / drafts (one series),
             "acceptance_by_position": accepted at position i / drafts (one series per `position` label)}.
    """
    raise NotImplementedError("TODO(ex11): 3 expressions: rate() of the _total counters, sum() across engines, "
                              "and vector matching for the per-position panel")


def k_table(alpha: float, k_max: int, max_batch_size: int, target_seconds, draft_seconds) -> list[tuple[int, int, int]]:
    """vLLM's num_speculative_tokens_per_batch_size for batch sizes 1..max_batch_size.

    For each batch size B, the best k in 0..k_max maximises B * (1 + alpha + ... + alpha^k) tokens per
    step over target_seconds(B * (k + 1)) + k * draft_seconds(B) seconds (the smallest k on ties).
    Returns inclusive (start, end, k) ranges, sorted, starting at 1 and ending at max_batch_size,
    with no gaps and adjacent ranges of equal k merged.
    """
    raise NotImplementedError("TODO(ex11): ~10 lines: the best k for every batch size, then merge runs of equal k")
