"""The standard rule (vLLM's `rejection_sample_method: "standard"`): token-wise rejection sampling.

Which drafted tokens the target keeps, and which token it adds. Follows Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023, Algorithm 1) and Chen et al. (DeepMind, 2023), in the p = target,
q = draft notation. Two versions of the same rule live here:

- `verify_step`: one sequence, one position at a time, written to be read (lesson 01);
- `rejection_sample`: a flattened, ragged batch of requests, vectorised, with vLLM's layout
  and conventions (lesson 06). The Triton kernel (lesson 07) must match it bit for bit.

The rule, for drafts x_1..x_k drawn from q_1..q_k:
  accept x_i while u_i <= p_i(x_i) / q_i(x_i), u_i ~ U(0, 1);
  at the first rejection emit a token from norm(max(p_i - q_i, 0)) and stop;
  if all k are accepted emit a bonus token from p_{k+1}.
Greedy verification accepts while x_i == argmax p_i and then emits argmax p.
"""

import torch

from speclab.verify.layout import (PLACEHOLDER_TOKEN_ID, check_batch, check_or_draw_noise,
                                    check_or_draw_uniforms, draw_uniforms)


# ----------------------------------------------------------------------------------------------
# One sequence, written to be read


def verify_step(draft_tokens, p: torch.Tensor, q: torch.Tensor | None = None, *,
                uniforms: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> list[int]:
    """Verify k drafted tokens of one sequence and return the tokens to append (1..k+1 of them).

    Args:
        draft_tokens: k token ids drafted from q.
        p: (k + 1, V) target probabilities at each drafted position, plus the bonus position.
        q: (k, V) draft probabilities the drafts were sampled from; None means the drafts are
            deterministic (one-hot q, as for n-gram or argmax drafters).
        uniforms: (k,) numbers in (0, 1) for the accept tests; drawn from `generator` when None.
        generator: torch.Generator for the uniforms and the final token.
    Returns:
        The accepted drafts followed by one recovered or bonus token.
    """
    draft_tokens = [int(t) for t in draft_tokens]
    k = len(draft_tokens)
    if uniforms is None:
        uniforms = draw_uniforms(k, generator, p.device)
    out = []
    for i, x in enumerate(draft_tokens):
        q_x = 1.0 if q is None else q[i, x].item()
        p_x = p[i, x].item()
        if q_x > 0 and p_x / q_x >= uniforms[i].item():  # accept with probability min(1, p/q)
            out.append(x)
            continue
        q_i = torch.zeros_like(p[i]) if q is None else q[i]
        if q is None:
            q_i[x] = 1.0
        residual = (p[i] - q_i).clamp(min=0)  # max(p - q, 0): where p wants more than q gave
        if residual.sum() <= 0:  # only when q_i == p_i yet x was rejected (x impossible under q)
            residual = p[i]
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[k], 1, generator=generator)))  # bonus token from p_{k+1}
    return out


def verify_greedy_step(draft_tokens, p: torch.Tensor) -> list[int]:
    """Greedy verification: keep drafts while they equal the target's argmax, then add the argmax.

    Args:
        draft_tokens: k token ids.
        p: (k + 1, V) target probabilities (or logits: only the argmax matters).
    """
    # (k + 1,): argmax's first maximum; torch's CPU argmax took 0.56 ms over (9, 49152) rows, max 0.18
    target = p.max(-1).indices.tolist()
    out = []
    for i, x in enumerate(draft_tokens):
        out.append(target[i])
        if int(x) != target[i]:
            return out
    out.append(target[len(draft_tokens)])
    return out


# ----------------------------------------------------------------------------------------------
# A flattened, ragged batch (vLLM's layout)


def rejection_sample(draft_token_ids, num_draft_tokens, target_probs, draft_probs=None, *,
                     greedy=False, uniforms=None, noise=None, generator=None) -> torch.Tensor:
    """Verify a ragged batch of drafts in one call.

    Request r drafted k_r = num_draft_tokens[r] tokens; its drafts sit at rows
    [cu_r, cu_r + k_r) of `draft_token_ids`/`draft_probs`, and its target rows at
    [cu_r + r, cu_r + r + k_r] of `target_probs` (k_r verification rows, then one bonus row).

    Args:
        draft_token_ids: (T,) int64, every request's drafts concatenated, T = sum(k_r).
            A PLACEHOLDER_TOKEN_ID (-1) draft is always rejected.
        num_draft_tokens: (B,) ints >= 0 (list or tensor).
        target_probs: (T + B, V) float target probabilities.
        draft_probs: (T, V) float draft probabilities, or None for one-hot drafts.
        greedy: bool for the whole batch, or (B,) bool tensor for mixed batches.
        uniforms: (T,) float64 in (0, 1) for the accept tests; drawn from `generator` when None.
        noise: (B, V) positive floats, one Exp(1) row per request, for the exponential race that
            picks the token ending the row (recovered or bonus); drawn from `generator` when None.
        generator: torch.Generator used for whatever is drawn here.
    Returns:
        (B, max_k + 1) int64: accepted drafts, then the recovered or bonus token, then -1.
    """
    draft_token_ids, k, target_probs, draft_probs, is_greedy = check_batch(
        draft_token_ids, num_draft_tokens, target_probs, draft_probs, greedy)
    B, V = k.numel(), target_probs.shape[1]
    T = draft_token_ids.numel()
    device = target_probs.device
    uniforms = check_or_draw_uniforms(uniforms, T, generator, device)
    noise = check_or_draw_noise(noise, B, V, generator, device)

    max_k = int(k.max()) if B else 0
    cu = torch.cumsum(k, 0) - k  # (B,) first draft row of each request
    pos = torch.arange(max_k, device=device)  # (max_k,)
    valid = pos[None, :] < k[:, None]  # (B, max_k) real draft positions
    draft_row = (cu[:, None] + pos[None, :]).clamp(max=max(T - 1, 0))  # (B, max_k)
    target_row = draft_row + torch.arange(B, device=device)[:, None]  # (B, max_k)

    drafts = torch.where(valid, draft_token_ids[draft_row], PLACEHOLDER_TOKEN_ID)  # (B, max_k)
    real = drafts >= 0  # (B, max_k)
    safe = drafts.clamp(min=0)
    # Random rows: accept iff q > 0 and p / q >= u (q = 1 for one-hot drafts).
    p_x = target_probs[target_row, safe]  # (B, max_k)
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs[draft_row, safe]
    u = uniforms[draft_row]  # (B, max_k)
    accept_random = real & (q_x > 0) & ((p_x / q_x).to(torch.float64) >= u)
    # Greedy rows: accept iff the draft is the target's argmax.
    accept_greedy = drafts == target_probs[target_row].argmax(-1)
    accept = valid & torch.where(is_greedy[:, None], accept_greedy, accept_random)
    n = accept.long().cumprod(1).sum(1)  # (B,) accepted drafts: the run before the first reject

    end_row = cu + torch.arange(B, device=device) + n  # (B,) the row whose token ends the output
    end_token = _final_tokens(target_probs[end_row], draft_probs, cu + n, drafts, n, k, is_greedy, noise)

    out = torch.full((B, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    out[:, :max_k] = torch.where(pos[None, :] < n[:, None], drafts, PLACEHOLDER_TOKEN_ID)
    return out.scatter_(1, n[:, None], end_token[:, None])


def _final_tokens(p_end, draft_probs, q_row, drafts, n, k, is_greedy, noise):
    """The token that ends each request's output: recovered (n < k) or bonus (n == k).

    Recovered tokens are drawn from max(p - q, 0) and bonus tokens from p, both by the
    exponential race argmax_v r(v) / E(v), E ~ Exp(1), which picks v with probability
    proportional to r(v) without normalising r.

    Args:
        p_end: (B, V) target row at position n of each request.
        draft_probs: (T, V) or None; q_row: (B,) its row at position n (used only when n < k).
        drafts: (B, max_k) padded drafts; n, k: (B,) accepted and drafted counts.
        is_greedy: (B,) bool; noise: (B, V) Exp(1).
    """
    rejected = n < k  # (B,)
    r = p_end
    if bool(rejected.any()):  # then max_k >= 1
        x = drafts.gather(1, n.clamp(max=drafts.shape[1] - 1)[:, None])  # (B, 1) the rejected draft
        if draft_probs is None:  # one-hot q: the residual is p with the draft token zeroed
            q_end = torch.zeros_like(p_end).scatter_(1, x.clamp(min=0), 1.0)
        else:
            q_end = draft_probs[q_row.clamp(max=draft_probs.shape[0] - 1)]
        q_end = torch.where(x >= 0, q_end, 0.0)  # a placeholder draft: draw from p itself
        residual = (p_end - q_end).clamp(min=0)  # (B, V) max(p - q, 0)
        empty = residual.amax(-1, keepdim=True) <= 0  # q == p, yet rejected: fall back to p
        r = torch.where(rejected[:, None] & ~empty, residual, p_end)
    raced = (r / noise).argmax(-1)  # (B,) exponential race
    return torch.where(is_greedy, p_end.argmax(-1), raced)
