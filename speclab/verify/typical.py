"""LOSSY: typical acceptance (Medusa-2), `rejection_sample_method: "typical"`. Not exact.

Cai, Li, Geng, Peng, Lee, Chen & Dao, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads" (ICML 2024), section 3.3.1. Instead of testing each draft against the
ratio p/q, typical acceptance keeps draft x_i whenever the target finds it typical enough:

  accept x_i  iff  p_i(x_i) > min(eps, delta * exp(-H(p_i))),   H(p) = -sum_x p(x) log p(x)

with Medusa's defaults eps = posterior_threshold = 0.09 and delta = posterior_alpha = 0.3; the
token that ends the row is sampled from p itself at the first refused position (or the bonus row).

THIS RULE DOES NOT PRESERVE THE TARGET'S DISTRIBUTION. It never looks at q, so a draft that
over-proposes a plausible token gets it accepted far more often than the target would emit it;
and high-entropy rows (low threshold) accept almost anything. The Medusa README says it "relaxes
the requirement of matching the distribution of the original model". Lesson 10 runs it through the
exactness test of the exact rules, sees that test fail and measures the total-variation distance
it costs against the tokens per step it buys (tests/test_10_typical.py). It is in
`speclab.verify.RULES` only under its own name and in `LOSSY_RULES`: nothing picks it unless
`rejection_sample_method="typical"` asks for it, and the Triton kernels do not implement it.

Same ragged layout, checks and random draws as the exact rules (`layout.py`): the uniforms are
drawn (and not used: acceptance is deterministic given p) so that a generator's later draws do
not depend on the rule; greedy rows use the greedy rule (typical acceptance at temperature 0 is
greedy); a placeholder (-1) draft is never accepted. Medusa decides its first token greedily and
picks the longest accepted candidate of a tree; here the drafts are one chain.
"""

import torch

from speclab.verify.layout import PLACEHOLDER_TOKEN_ID, check_batch, check_or_draw_noise, check_or_draw_uniforms

LOSSY = True  # read by the registry: this rule is not distribution-preserving
POSTERIOR_THRESHOLD = 0.09  # eps, Medusa's `posterior_threshold`
POSTERIOR_ALPHA = 0.3  # delta, Medusa's `posterior_alpha` ("recommended to be sqrt(posterior_threshold)")


def entropy(p: torch.Tensor) -> torch.Tensor:
    """H(p) = -sum p log p in nats, 0 log 0 = 0. Args: p (..., V). Returns: (...) float64."""
    p = p.to(torch.float64)
    return -(p * torch.where(p > 0, p, 1.0).log()).sum(-1)


def typical_threshold(p: torch.Tensor, posterior_threshold: float = POSTERIOR_THRESHOLD,
                      posterior_alpha: float = POSTERIOR_ALPHA) -> torch.Tensor:
    """min(eps, delta * exp(-H(p))): the probability a draft must exceed. Args: p (..., V). Returns: (...)."""
    return torch.clamp(posterior_alpha * torch.exp(-entropy(p)), max=posterior_threshold)


def rejection_sample(draft_token_ids, num_draft_tokens, target_probs, draft_probs=None, *,
                     greedy=False, uniforms=None, noise=None, generator=None,
                     posterior_threshold: float = POSTERIOR_THRESHOLD,
                     posterior_alpha: float = POSTERIOR_ALPHA) -> torch.Tensor:
    """LOSSY typical acceptance of a ragged batch (the output is NOT distributed as the target).

    Args: those of `speclab.verify.rejection.rejection_sample` (`draft_probs` is checked but not
        used: the rule ignores q), plus Medusa's `posterior_threshold` (eps) and `posterior_alpha` (delta).
    Returns:
        (B, max_k + 1) int64: accepted drafts, then a token sampled from p, then -1.
    """
    if not (0 < posterior_threshold <= 1 and posterior_alpha > 0):
        raise ValueError(f"need 0 < posterior_threshold <= 1 and posterior_alpha > 0, got "
                         f"{posterior_threshold} and {posterior_alpha} (Medusa's defaults: 0.09 and 0.3)")
    draft_token_ids, k, target_probs, draft_probs, is_greedy = check_batch(
        draft_token_ids, num_draft_tokens, target_probs, draft_probs, greedy)
    B, V, T = k.numel(), target_probs.shape[1], draft_token_ids.numel()
    device = target_probs.device
    check_or_draw_uniforms(uniforms, T, generator, device)  # drawn in the common order, not used
    noise = check_or_draw_noise(noise, B, V, generator, device)

    max_k = int(k.max()) if B else 0
    cu = torch.cumsum(k, 0) - k  # (B,)
    b = torch.arange(B, device=device)
    pos = torch.arange(max_k, device=device)
    valid = pos[None, :] < k[:, None]  # (B, max_k)
    draft_row = (cu[:, None] + pos[None, :]).clamp(max=max(T - 1, 0))
    target_row = draft_row + b[:, None]
    drafts = torch.where(valid, draft_token_ids[draft_row], PLACEHOLDER_TOKEN_ID)  # (B, max_k)
    p_rows = target_probs[target_row]  # (B, max_k, V)
    p_x = p_rows.gather(2, drafts.clamp(min=0)[:, :, None])[:, :, 0].to(torch.float64)
    typical = (drafts >= 0) & (p_x > typical_threshold(p_rows, posterior_threshold, posterior_alpha))
    greedy_ok = drafts == p_rows.argmax(-1)
    accept = valid & torch.where(is_greedy[:, None], greedy_ok, typical)
    n = accept.long().cumprod(1).sum(1)  # (B,) the run of accepted drafts

    p_end = target_probs[cu + b + n]  # (B, V): the first refused position's row, or the bonus row
    end_token = torch.where(is_greedy, p_end.argmax(-1), (p_end / noise).argmax(-1))
    out = torch.full((B, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    out[:, :max_k] = torch.where(pos[None, :] < n[:, None], drafts, PLACEHOLDER_TOKEN_ID)
    return out.scatter_(1, n[:, None], end_token[:, None])
