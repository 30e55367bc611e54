"""The block rule (vLLM's `rejection_sample_method: "block"`): block verification.

Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro & Suresh, "Block Verification Accelerates
Speculative Decoding" (ICLR 2025, arXiv 2403.10444), Algorithm 2. The token-wise rule
(`rejection.py`) decides each draft on its own ratio p/q and stops at the first rejection; block
verification decides from the whole block's prefix ratios, so a draft that token-wise would reject
can still be kept when the drafts after it make up for it. For drafts X_1..X_k drawn from
q_1..q_k, target rows p_1..p_{k+1} (p_i = p(. | X_1..X_{i-1})):

  rho_0 = 1,  rho_i = min(rho_{i-1} * p_i(X_i) / q_i(X_i), 1)          cumulative prefix ratio
  h_i = Z_{i+1} / (Z_{i+1} + 1 - rho_i),  Z_{i+1} = sum_x max(rho_i p_{i+1}(x) - q_{i+1}(x), 0)   (i < k)
  h_k = rho_k
  tau = the LAST i with u_i <= h_i (0 if none): not the first failure
  emit X_1..X_tau, then Y ~ p_{k+1} if tau = k, else Y ~ norm(max(rho_tau p_{tau+1} - q_{tau+1}, 0))

It is exact over the whole loop (the law of the generated sequence is the target's; a single
step's positions are not each distributed as p_j, unlike the token-wise rule), and its expected
accepted drafts are >= the token-wise rule's for every target, draft and k (the paper's
Theorems 1 and 2). For k = 1 it is the token-wise rule. For one-hot drafts (n-gram, suffix,
greedy drafters: `draft_probs=None`) the token-wise rule already accepts X_1..X_i with the most
probability any exact rule can, prod_j p_j(X_j), so block verification gains nothing there (and
at temperature 0 it is the greedy rule): vLLM runs it only when draft probabilities exist.

Conventions shared with the token-wise rule: the ragged layout and the random draws of
`layout.py` (one uniform per draft, then one Exp(1) noise row per request for the exponential race
that samples the last token), greedy rows use the greedy rule, a draft with q(X) = 0 never passes,
and a request's drafts end at its first placeholder (-1): what follows is ignored, and the target
row at the placeholder plays the bonus row. Prefix ratios, thresholds and residuals are computed in
float64, in one fixed order, which the Triton kernel repeats bit for bit.

`expected_accepted` and `gain_table` give the exact expected accepted drafts of both rules on the
toy Markov pair of `speclab.toy` (what lesson 10 tabulates for gamma = 1..8).
"""

import torch

from speclab.toy import MarkovLM
from speclab.verify.layout import PLACEHOLDER_TOKEN_ID, check_batch, check_or_draw_noise, check_or_draw_uniforms

# ----------------------------------------------------------------------------------------------
# The rule's three pieces (tests swap in broken ones: tests/test_10_block.py)


def prefix_ratio(rho_prev: torch.Tensor, p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """rho_i = min(rho_{i-1} p_i(X_i) / q_i(X_i), 1); 0 where q_i(X_i) = 0 (X_i was not drawn from q).

    Args: (B,) float64 each. Returns: (B,) float64.
    """
    ratio = p_x / torch.where(q_x > 0, q_x, 1.0)
    return torch.where(q_x > 0, torch.minimum(rho_prev * ratio, torch.ones_like(rho_prev)), 0.0)


def block_residual(rho: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(rho p - q, 0), unnormalised: what the target still owes after a block of ratio rho.

    Args: rho (B,) float64; p, q (B, V) float64. Returns: (B, V) float64.
    """
    return (rho[:, None] * p - q).clamp(min=0)


def last_passing(passed: torch.Tensor) -> torch.Tensor:
    """tau: the last position i (1-based) whose test passed, 0 if none. The crux of the rule.

    Args: passed (B, max_k) bool. Returns: (B,) int64.
    """
    pos = torch.arange(1, passed.shape[1] + 1, device=passed.device)
    return (passed * pos).amax(1) if passed.shape[1] else torch.zeros(passed.shape[0], dtype=torch.int64,
                                                                      device=passed.device)


# ----------------------------------------------------------------------------------------------
# A flattened, ragged batch (vLLM's layout)


def rejection_sample(draft_token_ids, num_draft_tokens, target_probs, draft_probs=None, *,
                     greedy=False, uniforms=None, noise=None, generator=None) -> torch.Tensor:
    """Verify a ragged batch of drafts with block verification.

    Args: those of `speclab.verify.rejection.rejection_sample` (layout: `speclab.verify.layout`).
    Returns:
        (B, max_k + 1) int64: accepted drafts, then the recovered or bonus token, then -1.
    """
    draft_token_ids, k, target_probs, draft_probs, is_greedy = check_batch(
        draft_token_ids, num_draft_tokens, target_probs, draft_probs, greedy)
    B, V, T = k.numel(), target_probs.shape[1], draft_token_ids.numel()
    device = target_probs.device
    uniforms = check_or_draw_uniforms(uniforms, T, generator, device)
    noise = check_or_draw_noise(noise, B, V, generator, device)

    max_k = int(k.max()) if B else 0
    cu = torch.cumsum(k, 0) - k  # (B,) first draft row of each request
    b = torch.arange(B, device=device)
    pos = torch.arange(max_k, device=device)  # (max_k,)
    valid = pos[None, :] < k[:, None]  # (B, max_k)
    draft_row = (cu[:, None] + pos[None, :]).clamp(max=max(T - 1, 0))  # (B, max_k)
    drafts = torch.where(valid, draft_token_ids[draft_row], PLACEHOLDER_TOKEN_ID)  # (B, max_k)
    k_eff = (drafts >= 0).long().cumprod(1).sum(1)  # (B,) drafts before the first placeholder

    n_greedy = _greedy_accepted(drafts, target_probs, draft_row + b[:, None], valid)
    rho, h = _thresholds(drafts, k_eff, cu, target_probs, draft_probs)  # (B, max_k + 1), (B, max_k)
    u = uniforms[draft_row]  # (B, max_k)
    tau = last_passing((pos[None, :] < k_eff[:, None]) & (u <= h))  # (B,)
    n = torch.where(is_greedy, n_greedy, tau)  # (B,) accepted drafts

    end_token = _end_tokens(target_probs, draft_probs, drafts, cu, n, k_eff, rho, is_greedy, noise)
    out = torch.full((B, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    out[:, :max_k] = torch.where(pos[None, :] < n[:, None], drafts, PLACEHOLDER_TOKEN_ID)
    return out.scatter_(1, n[:, None], end_token[:, None])


def _greedy_accepted(drafts, target_probs, target_row, valid):
    """(B,) drafts accepted by the greedy rule: the run of drafts equal to the target's argmax."""
    accept = valid & (drafts == target_probs[target_row].argmax(-1))  # (B, max_k)
    return accept.long().cumprod(1).sum(1)


def _draft_row_probs(draft_probs, drafts, cu, i, V, dtype):
    """(B, V) q rows at draft position i (0-based): the given rows, or one-hot at the draft."""
    if draft_probs is None:
        x = drafts[:, i:i + 1]  # (B, 1)
        return torch.zeros(x.shape[0], V, dtype=dtype, device=x.device).scatter_(1, x.clamp(min=0), 1.0) \
            * (x >= 0)
    return draft_probs[(cu + i).clamp(max=draft_probs.shape[0] - 1)].to(dtype)


def _thresholds(drafts, k_eff, cu, target_probs, draft_probs):
    """Prefix ratios rho (B, max_k + 1), rho[:, 0] = 1, and thresholds h (B, max_k); h = 0 past k_eff.

    Position by position (0-based i = draft X_{i+1}), in the order the Triton kernel repeats.
    """
    B, max_k = drafts.shape
    V, f64 = target_probs.shape[1], torch.float64
    b = torch.arange(B, device=drafts.device)
    safe = drafts.clamp(min=0)
    rho = torch.ones(B, max_k + 1, dtype=f64, device=drafts.device)
    h = torch.zeros(B, max_k, dtype=f64, device=drafts.device)
    for i in range(max_k):
        live = i < k_eff  # (B,) X_{i+1} is a real draft of this request
        t_row = (cu + b + i).clamp(max=target_probs.shape[0] - 1)
        p_x = target_probs[t_row, safe[:, i]].to(f64)
        q_x = torch.ones_like(p_x) if draft_probs is None else \
            draft_probs[(cu + i).clamp(max=draft_probs.shape[0] - 1), safe[:, i]].to(f64)
        rho[:, i + 1] = torch.where(live, prefix_ratio(rho[:, i], p_x, q_x), 0.0)
        has_next = (i + 1) < k_eff  # (B,) h from the block residual of the next position
        if bool(has_next.any()):
            p_next = target_probs[(t_row + 1).clamp(max=target_probs.shape[0] - 1)].to(f64)  # (B, V)
            q_next = _draft_row_probs(draft_probs, drafts, cu, min(i + 1, max_k - 1), V, f64)
            z = block_residual(rho[:, i + 1], p_next, q_next).sum(-1)  # (B,) Z_{i+2}
            denom = z + (1.0 - rho[:, i + 1])
            h_next = torch.where(denom > 0, z / torch.where(denom > 0, denom, 1.0), 1.0)
        else:
            h_next = torch.zeros(B, dtype=f64, device=drafts.device)
        h[:, i] = torch.where(has_next, h_next, torch.where(live, rho[:, i + 1], 0.0))
    return rho, h


def _end_tokens(target_probs, draft_probs, drafts, cu, n, k_eff, rho, is_greedy, noise):
    """The token at column n: bonus from p (n = k_eff), or from max(rho_n p - q, 0) (n < k_eff),
    by the exponential race argmax_v r(v) / E(v); p itself when the residual is all zero."""
    B, V = noise.shape
    f64 = torch.float64
    b = torch.arange(B, device=noise.device)
    p_end = target_probs[cu + b + n]  # (B, V)
    p64 = p_end.to(f64)
    r = p64
    rejected = n < k_eff  # (B,)
    if bool(rejected.any()):
        x = drafts.gather(1, n.clamp(max=max(drafts.shape[1] - 1, 0))[:, None])  # (B, 1) the first unkept draft
        if draft_probs is None:
            q_end = torch.zeros_like(p64).scatter_(1, x.clamp(min=0), 1.0)
        else:
            q_end = draft_probs[(cu + n).clamp(max=draft_probs.shape[0] - 1)].to(f64)
        residual = block_residual(rho.gather(1, n[:, None])[:, 0], p64, q_end)  # (B, V)
        empty = residual.amax(-1, keepdim=True) <= 0
        r = torch.where(rejected[:, None] & ~empty, residual, p64)
    raced = (r / noise.to(f64)).argmax(-1)  # (B,) exponential race
    return torch.where(is_greedy, p_end.argmax(-1), raced)


# ----------------------------------------------------------------------------------------------
# Exact expectations on the toy Markov pair (lesson 10's gain table)


def expected_accepted(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E[accepted drafts | drafts] under block and token-wise verification, exactly, for N blocks.

    Token-wise: sum_i prod_{j<=i} min(1, p_j(X_j) / q_j(X_j)). Block: the tests are independent,
    so P(tau >= i) = 1 - prod_{j>=i} (1 - h_j) and E[tau] = sum_i P(tau >= i).

    Args:
        p: (N, k + 1, V) target rows along each block; q: (N, k, V) draft rows; drafts: (N, k) ids.
    Returns:
        (block, token-wise): (N,) float64 expected accepted drafts each.
    """
    N, k = drafts.shape
    if k == 0:
        return torch.zeros(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64)
    p, q = p.to(torch.float64), q.to(torch.float64)
    p_x = p[:, :k].gather(2, drafts[:, :, None])[:, :, 0]  # (N, k)
    q_x = q.gather(2, drafts[:, :, None])[:, :, 0]
    ratio = torch.where(q_x > 0, (p_x / torch.where(q_x > 0, q_x, 1.0)).clamp(max=1.0), 0.0)
    token_wise = torch.cumprod(ratio, 1).sum(1)
    cu = torch.arange(N) * k
    _, h = _thresholds(drafts, torch.full((N,), k), cu, p.reshape(N * (k + 1), -1), q.reshape(N * k, -1))
    miss = torch.flip(torch.cumprod(torch.flip(1.0 - h, [1]), 1), [1])  # (N, k) prod_{j>=i} (1 - h_j)
    return (1.0 - miss).sum(1), token_wise


def at_temperature(lm, temperature: float):
    """A toy MarkovLM with every row raised to 1 / temperature (temperature 0: one-hot argmax rows)."""
    rows = torch.cat([lm.initial[None], lm.transition])  # (V + 1, V)
    if temperature == 0:
        rows = torch.nn.functional.one_hot(rows.argmax(-1), rows.shape[1]).to(torch.float64)
    else:
        rows = (rows.log() / temperature).softmax(-1)
    return MarkovLM(rows[1:], rows[0])


def expected_tokens_per_step(target, draft, gamma: int) -> tuple[float, float]:
    """Exact mean tokens per step (1 + accepted drafts) of block and token-wise verification.

    Every draft block X_1..X_gamma ~ draft is enumerated (V^gamma of them) after each start token,
    start tokens weighted uniformly; at temperature 0 (one-hot rows) drafts are the draft's argmax.

    Args:
        target, draft: toy `speclab.toy.MarkovLM`s over one vocabulary.
    Returns:
        (block, token-wise) mean tokens per step.
    """
    V = target.vocab_size
    seqs = torch.cartesian_prod(*[torch.arange(V)] * (gamma + 1)).reshape(-1, gamma + 1)  # (V^(g+1), g+1)
    ctx, drafts = seqs, seqs[:, 1:]  # ctx[:, 0] is the start token
    q = draft.transition[ctx[:, :-1]]  # (N, gamma, V)
    p = target.transition[ctx]  # (N, gamma + 1, V)
    weight = q.gather(2, drafts[:, :, None])[:, :, 0].prod(1) / V  # (N,) P(start) q(X_1..X_gamma)
    keep = weight > 0
    e_block, e_token = expected_accepted(p[keep], q[keep], drafts[keep])
    w = weight[keep]
    return 1.0 + float((w * e_block).sum()), 1.0 + float((w * e_token).sum())


def gain_table(target, draft, gammas=range(1, 9), temperatures=(1.0, 0.0)) -> list[dict]:
    """Rows (temperature, gamma, block, token_wise, gain) of exact mean tokens per step."""
    rows = []
    for temperature in temperatures:
        t, d = at_temperature(target, temperature), at_temperature(draft, temperature)
        for gamma in gammas:
            e_block, e_token = expected_tokens_per_step(t, d, gamma)
            rows.append(dict(temperature=temperature, gamma=gamma, block=e_block, token_wise=e_token,
                             gain=e_block - e_token))
    return rows


def toy_pair(vocab_size: int = 4, seed: int = 0, weight: float = 0.5):
    """Lesson 10's toy pair: a random MarkovLM target and a draft blended from another random one."""
    g = torch.Generator().manual_seed(seed)
    target = MarkovLM.random(vocab_size, g, spread=1.5)
    return target, target.blend(MarkovLM.random(vocab_size, g, spread=2.0), weight)


def main():
    target, draft = toy_pair()
    print("block vs token-wise verification: exact mean tokens per step on the toy Markov pair "
          "(V = 4, speclab.verify.block.toy_pair())")
    print(f"{'T':>4} {'gamma':>5} {'block':>8} {'token-wise':>10} {'gain':>8} {'gain %':>7}")
    for r in gain_table(target, draft):
        print(f"{r['temperature']:>4.1f} {r['gamma']:>5} {r['block']:>8.4f} {r['token_wise']:>10.4f} "
              f"{r['gain']:>8.4f} {100 * r['gain'] / r['token_wise']:>6.2f}%")


if __name__ == "__main__":
    main()
