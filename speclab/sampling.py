"""From logits to probabilities, and from probabilities to tokens.

Speculative sampling is exact only if the target and the draft are sampled from the
distributions they are verified against, so the same processing (temperature, then top-k,
then top-p, in vLLM's order) must be applied to both. Everything here works on the last
dimension, so it serves one row (V,), a sequence (k + 1, V) and a flattened batch (N, V).

Temperature 0 means greedy: the probabilities become one-hot on the argmax.
"""

import torch

# Probabilities must sum to 1 within this tolerance (float32 sums over 128K entries drift ~1e-5).
PROB_SUM_ATOL = 1e-3
# Below this temperature sampling is greedy (vLLM's _SAMPLING_EPS): dividing logits by ~1e-37 would
# overflow to inf, and the argmax is what such a temperature means anyway.
SAMPLING_EPS = 1e-5


def check_probs(probs: torch.Tensor, name: str = "probs") -> None:
    """Raise a ValueError naming the problem when `probs` rows are not distributions.

    Args:
        probs: (..., V) floating tensor; every row must be >= 0, finite and sum to 1.
        name: what to call the tensor in the message.
    """
    if not torch.is_tensor(probs) or not probs.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of probabilities, got "
                         f"{type(probs).__name__}{'' if not torch.is_tensor(probs) else ' ' + str(probs.dtype)}")
    if probs.numel() == 0:
        return
    # Each check reads the rows once, cheaply first (a verify step checks p and q, (k + 1) x 49152 floats
    # each: isfinite().all(), < 0 .any() and a float64 sum took 0.50, 0.23 and 0.17 ms over 5 rows on
    # 2026-12-04's Xeon, a sum, min() and a float32 sum 0.01, 0.05 and 0.01), and exactly where that fails.
    if not bool(torch.isfinite(probs.sum())) and not bool(torch.isfinite(probs).all()):
        raise ValueError(f"{name} contains NaN or inf: pass softmax(logits), not logits")
    if bool(probs.min() < 0):
        raise ValueError(f"{name} has negative entries: pass softmax(logits), not logits")
    sums = probs.sum(-1)
    if float((sums - 1).abs().max()) <= PROB_SUM_ATOL / 2:  # float32's error is far below the margin
        return
    sums = probs.sum(-1, dtype=torch.float64)
    worst = (sums - 1).abs().max().item()
    if worst > PROB_SUM_ATOL:
        row = int((sums - 1).abs().flatten().argmax())
        raise ValueError(f"{name} row {row} sums to {sums.flatten()[row].item():.6f}, not 1: "
                         f"rows must be probability distributions (use speclab.sampling.logits_to_probs)")


def _per_row(x, logits: torch.Tensor) -> torch.Tensor:
    """A scalar or (N,) setting as an (N, 1) column that broadcasts against (N, V) logits."""
    x = torch.as_tensor(x, device=logits.device)
    return x.reshape(-1, 1) if x.dim() == 1 else x


def apply_top_k(logits: torch.Tensor, top_k) -> torch.Tensor:
    """Keep the `top_k` largest logits of each row, set the rest to -inf.

    Args:
        logits: (N, V) or (V,).
        top_k: int or (N,) ints; 0 or -1 (or >= V) keeps everything, as in vLLM.
    Returns:
        A new tensor shaped like `logits`.
    """
    V = logits.shape[-1]
    k = torch.as_tensor(top_k, device=logits.device).long()
    k = torch.where((k <= 0) | (k > V), torch.full_like(k, V), k)
    if bool((k == V).all()):
        return logits.clone()
    sorted_logits = logits.sort(dim=-1, descending=True).values  # (N, V)
    k = k.reshape(-1, 1) if k.dim() == 1 else k.reshape(1).expand(*logits.shape[:-1], 1)
    kth = sorted_logits.gather(-1, k - 1)  # the k-th largest value per row
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of largest-probability tokens whose mass reaches `top_p`.

    The most likely token is always kept. Ties at the boundary are broken by sort order.

    Args:
        logits: (N, V) or (V,).
        top_p: float or (N,) floats in (0, 1]; 1 keeps everything.
    """
    p = _per_row(top_p, logits).to(logits.dtype)
    if bool((p >= 1).all()):
        return logits.clone()
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)  # (N, V) mass of the tokens ranked at or above each
    drop_sorted = ((cum - sorted_logits.softmax(-1)) >= p) & (p < 1)  # mass strictly above already reaches p
    # (p < 1: a row with top_p = 1 keeps its whole tail even where float cumsums pass 1 in a mixed batch)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def logits_to_probs(logits: torch.Tensor, temperature=1.0, top_k=0, top_p=1.0) -> torch.Tensor:
    """Temperature, then top-k, then top-p, then softmax (float32 or wider).

    Apply the same call to the target's and the draft's logits: verification compares the
    two *processed* distributions.

    Args:
        logits: (..., V) raw logits.
        temperature: float or (N,) floats; 0 (below SAMPLING_EPS) means greedy (one-hot on the argmax).
        top_k: int or (N,) ints; 0 or -1 disables.
        top_p: float or (N,) floats in (0, 1]; 1 disables.
    Returns:
        (..., V) probabilities, rows summing to 1.
    """
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if x.dtype == torch.float32 and temperature_only(temperature, top_k, top_p, x.shape[-1]):  # a drafter's q
        return (x / temperature).softmax(-1)  # the bits of the path below, without its checks and copies
    shape = logits.shape
    x = x.reshape(-1, shape[-1])
    t = _per_row(temperature, x).to(x.dtype)
    if bool((t < 0).any()):
        raise ValueError("temperature must be >= 0 (0 means greedy)")
    tp = _per_row(top_p, x)
    if bool(((tp <= 0) | (tp > 1)).any()):
        raise ValueError("top_p must be in (0, 1] (1 disables it)")
    if not bool(torch.isfinite(t).all()):
        raise ValueError("temperature must be finite")
    is_greedy = t < SAMPLING_EPS
    x = x / torch.where(is_greedy, torch.ones_like(t), t)
    x = apply_top_p(apply_top_k(x, top_k), top_p)
    probs = x.softmax(-1)
    if bool(is_greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.reshape(-1, shape[-1]).argmax(-1, keepdim=True), 1.0)
        probs = torch.where(is_greedy, one_hot, probs)
    return probs.reshape(shape)


def temperature_only(temperature, top_k, top_p, vocab_size: int) -> bool:
    """Whether one request's settings, as Python numbers, leave only the temperature to apply: a valid
    temperature above SAMPLING_EPS, no top-k (0, -1 or at least the vocabulary) and top_p 1. Drafters
    call `logits_to_probs` once per drafted token with such settings (0.10 ms a call over 49152 tokens
    took 0.04 by this path; 2026-12-07, Zen 5 EPYC, one thread)."""
    number = (int, float)
    return (isinstance(temperature, number) and isinstance(top_k, int) and isinstance(top_p, number)
            and SAMPLING_EPS <= temperature < float("inf") and (top_k <= 0 or top_k >= vocab_size) and top_p == 1)


def greedy(probs: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row (first index on ties): (..., V) -> (...) int64."""
    return probs.argmax(-1)


def sample_cdf(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token from each row of `probs` by its inverse CDF: (..., V) -> (...) int64, the same law
    as `sample`, from one float64 uniform per row drawn with `generator`. The first token whose
    float64 cumulative sum exceeds u times the row's total wins, so a zero-probability token never
    does. The engine drafts with it: torch.multinomial took 0.84 ms over a 49152-token row, this
    0.04 ms (2026-12-04's Xeon, one thread)."""
    flat = probs.reshape(-1, probs.shape[-1])
    cdf = flat.double().cumsum(-1)  # (N, V)
    total = cdf[:, -1:]
    u = torch.rand(flat.shape[0], 1, dtype=torch.float64, generator=generator, device=flat.device)
    point = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # < total: a token with p > 0
    return torch.searchsorted(cdf, point, right=True).reshape(probs.shape[:-1])


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token from each row of `probs`: (..., V) -> (...) int64, drawn with `generator`."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


# ----------------------------------------------------------------------------------------------
# Randomness keyed by position: what makes a seeded request's output independent of batching


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One round of SplitMix64 (Steele et al., 2014): a well-mixed 64-bit function of x."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def position_key(seed: int, position: int) -> int:
    """A 63-bit generator seed that depends on (seed, position) only (a counter-based stream)."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ position) >> 1


def exponential_noise(shape, generator: torch.Generator | None = None, device="cpu") -> torch.Tensor:
    """float32 Exp(1) noise: on a CPU, the very numbers `torch.empty(shape).exponential_(generator=...)`
    draws, with the generator left in the same state (-log1p(-u) of the same float64 uniforms, rounded
    to float32; tests/test_01_sampling_noise.py checks the bits), but in one vectorised pass where
    exponential_ takes a scalar log per number: 0.33 ms against 0.94 ms for a 49152-token row
    (2026-12-06, Intel Xeon, one thread). Elsewhere (a CUDA generator) it is exponential_ itself."""
    if torch.device(device).type != "cpu":
        return torch.empty(shape, dtype=torch.float32, device=device).exponential_(generator=generator)
    return torch.rand(shape, dtype=torch.float64, generator=generator).neg_().log1p_().neg_().float()


def keyed_noise(seed: int, positions, V: int, device="cpu") -> torch.Tensor:
    """(len(positions), V) float32 Exp(1) rows; row i is a function of (seed, positions[i]) alone,
    never of how many numbers were drawn before it."""
    rows = torch.empty(len(positions), V, dtype=torch.float32)
    for i, t in enumerate(positions):
        rows[i] = exponential_noise(V, torch.Generator().manual_seed(position_key(seed, int(t))))
    return rows.clamp_(min=torch.finfo(torch.float32).tiny).to(device)


def keyed_sample(probs: torch.Tensor, seed: int, positions) -> torch.Tensor:
    """Sample one token per row by the exponential race argmax_v p(v) / E(v) with E = keyed_noise:
    (n, V) -> (n,) int64. Row i's token depends only on its probabilities, the seed and positions[i]."""
    return (probs / keyed_noise(seed, positions, probs.shape[-1], probs.device)).argmax(-1)
