"""Exercise 08: the three moves of a head drafter: EAGLE's input shift, its chain, Medusa's heads.

1. `eagle_input_ids`: the target just verified a flattened ragged batch; EAGLE's first pass reads, at
   each row t, the feature f_t and the token *one position ahead*, x_{t+1}. The lesson's cell does this
   when every row was kept. Here, as in vLLM's default padded drafter batch, the rows of rejected drafts
   stay in the batch as padding: each request's last *valid* row (query_start_loc[b + 1] - 1 -
   num_rejected_tokens[b]) reads the token just sampled for it, and that row is where its first draft is
   read (vLLM's `last_token_indices`, computed on the GPU by `eagle_prepare_inputs_padded_kernel`).
2. `chain_draft`: the head's output g at the last committed row gives draft 1; each further draft
   feeds (previous draft, g) back, one position further on: k drafts, k - 1 extra head steps.
3. `medusa_logits`: Medusa head i's logits, lm_head(z + SiLU(W_i z + b_i)) with z = norm(h).
Grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex08_eagle_heads.py
Lesson: notebooks/08_eagle_mtp_medusa.ipynb.
"""

import torch
import torch.nn.functional as F


def eagle_input_ids(target_token_ids: list[int], query_start_loc: list[int], next_token_ids: list[int],
                    num_rejected_tokens: list[int]) -> tuple[list[int], list[int]]:
    """The first pass's input tokens, padded layout.

    Args:
        target_token_ids: (N,) the tokens the target just ran, requests concatenated.
        query_start_loc: (B + 1,) request b ran rows query_start_loc[b] .. query_start_loc[b + 1] - 1.
        next_token_ids: (B,) the token just sampled for each request (recovered or bonus).
        num_rejected_tokens: (B,) how many of each request's last rows held drafts that were rejected.
    Returns:
        (input_ids, last_token_indices): input_ids (N,) is target_token_ids shifted left by one, with
        next_token_ids[b] written at last_token_indices[b] = query_start_loc[b + 1] - 1 - num_rejected_tokens[b];
        the rows after it (the padding of rejected drafts) are never read and may hold anything.
    """
    ids = list(target_token_ids[1:]) + [0]
    last = [query_start_loc[b + 1] - 1 - num_rejected_tokens[b] for b in range(len(next_token_ids))]
    for b, nxt in enumerate(next_token_ids):
        ids[last[b]] = nxt
    return ids, last


def chain_draft(first_g: torch.Tensor, position: int, k: int, step, logits) -> list[int]:
    """k greedy drafts from the head's output first_g (d,) at the last committed row.

    Args:
        position: where the first chained input sits (the position of the newest committed token).
        step: step(token, feature, position) -> (d,) the head's output for input (token, feature) there.
        logits: logits(g) -> (V,).
    """
    drafts, g = [], first_g
    for i in range(k):
        drafts.append(int(logits(g).argmax()))
        if i + 1 < k:
            g = step(drafts[-1], g, position + i)
    return drafts


def medusa_logits(h: torch.Tensor, norm, W: torch.Tensor, b: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """One Medusa head: (..., d) last-layer hidden states -> (..., V) logits of its guess.

    Args:
        norm: the target's final norm (a callable); W (d, d), b (d,): the head's residual block;
        lm_head_weight: (V, d) the target's LM head, shared by every head.
    """
    z = norm(h)
    return F.linear(z + F.silu(F.linear(z, W, b)), lm_head_weight)
