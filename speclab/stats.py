"""Statistics to test exactness, and the theory that predicts speed.

Tests: chi-squared goodness of fit (one sample against known probabilities, and two samples
against each other), total-variation distance, and the smallest TV a test of N samples
detects, from the non-central chi-squared law (Cauchy-Schwarz gives noncentrality >= 4 N TV^2).

Theory, from Leviathan, Kalman & Matias (ICML 2023), Theorem 3.5, Eq. (1), Theorem 3.8:
  beta = sum_x min(p(x), q(x))                              acceptance of one drafted token
  E[tokens per step] = (1 - alpha^(gamma+1)) / (1 - alpha)  (= 1 + alpha + ... + alpha^gamma)
  speedup S = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))
"""

import math

import numpy as np
import torch
from scipy import stats as _sp

# ----------------------------------------------------------------------------------------------
# Tests


def tv_distance(p, q) -> float:
    """Total-variation distance 1/2 sum |p - q| between two distributions (any shapes, flattened)."""
    p = torch.as_tensor(p, dtype=torch.float64).flatten()
    q = torch.as_tensor(q, dtype=torch.float64).flatten()
    return 0.5 * float((p - q).abs().sum())


MIN_EXPECTED = 5.0  # cells expected to hold fewer samples are pooled, so the chi2 law holds


def _pearson(counts, probs) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom, pooling cells expected below MIN_EXPECTED.

    Returns (inf, 1) when a cell of probability 0 was observed: impossible under the null.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    if counts.shape != probs.shape:
        raise ValueError(f"counts {counts.shape} and probs {probs.shape} must have the same cells")
    n = counts.sum()
    if n == 0:
        return 0.0, 0
    probs = probs / probs.sum()
    support = probs > 0
    if counts[~support].sum() > 0:
        return math.inf, 1
    expected, observed = n * probs[support], counts[support]
    small = expected < MIN_EXPECTED
    if small.sum() > 1:
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    return float(((observed - expected) ** 2 / expected).sum()), len(expected) - 1


def chi2_gof(counts, probs) -> float:
    """p-value of Pearson's chi-squared test that `counts` were drawn from `probs`.

    Cells of probability 0 are left out (one observation there gives p-value 0); cells
    expected to hold fewer than MIN_EXPECTED samples are pooled into one.

    Args:
        counts: (C,) observed counts.
        probs: (C,) cell probabilities (rescaled to sum 1).
    """
    if np.asarray(counts).sum() == 0:
        raise ValueError("no observations: nothing to test")
    stat, df = _pearson(counts, probs)
    return 1.0 if df == 0 else float(_sp.chi2.sf(stat, df))


def chi2_gof_strata(counts_per_stratum, probs_per_stratum) -> float:
    """One chi-squared test over several strata, each with its own known distribution.

    The statistics and degrees of freedom add up. Used for "each emitted position j, among the
    samples that reached it, follows p_j".

    Args:
        counts_per_stratum: sequence of (C_j,) counts; strata with no observations are skipped.
        probs_per_stratum: sequence of (C_j,) probabilities.
    """
    parts = [_pearson(c, p) for c, p in zip(counts_per_stratum, probs_per_stratum)]
    stat, df = sum(s for s, _ in parts), sum(d for _, d in parts)
    return 1.0 if df == 0 else float(_sp.chi2.sf(stat, df))


def chi2_two_sample(counts_a, counts_b) -> float:
    """p-value of the chi-squared test that two count vectors come from the same distribution.

    Cells empty in both samples are dropped. Use when the exact distribution is unknown (the
    engine's speculative samples against its own direct samples).
    """
    table = np.stack([np.asarray(counts_a, np.float64).ravel(), np.asarray(counts_b, np.float64).ravel()])
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return 1.0
    return float(_sp.chi2_contingency(table, correction=False).pvalue)


def min_detectable_tv(n: int, num_cells: int, significance: float = 1e-4, power: float = 0.99) -> float:
    """The smallest TV distance a chi-squared test of `n` samples over `num_cells` cells detects.

    Under an alternative at TV distance d, the statistic is non-central chi-squared with
    noncentrality lambda >= 4 n d^2 (Cauchy-Schwarz), so a test that rejects with probability
    `power` at lambda* detects every d >= sqrt(lambda* / (4 n)).
    """
    df = num_cells - 1
    crit = _sp.chi2.isf(significance, df)
    lo, hi = 0.0, 1e6
    for _ in range(200):  # bisect lambda* with P(ncx2(df, lambda*) > crit) = power
        mid = (lo + hi) / 2
        if _sp.ncx2.sf(crit, df, mid) < power:
            lo = mid
        else:
            hi = mid
    return math.sqrt(hi / (4 * n))


def samples_for_tv(tv: float, num_cells: int, significance: float = 1e-4, power: float = 0.99) -> int:
    """How many samples a chi-squared test needs to detect a TV distance `tv` (inverse of the above)."""
    lam = min_detectable_tv(1, num_cells, significance, power) ** 2 * 4
    return math.ceil(lam / (4 * tv * tv))


# ----------------------------------------------------------------------------------------------
# Theory


def acceptance_prob(p, q) -> torch.Tensor:
    """beta = sum_x min(p(x), q(x)): the probability that a token drawn from q is accepted under p.

    Args:
        p, q: (..., V) target and draft probabilities.
    Returns:
        (...) acceptance probabilities.
    """
    return torch.minimum(torch.as_tensor(p), torch.as_tensor(q)).sum(-1)


def expected_tokens(alpha, gamma: int):
    """Expected tokens emitted per target forward with gamma drafts and i.i.d. acceptance alpha.

    (1 - alpha^(gamma+1)) / (1 - alpha), which is gamma + 1 at alpha = 1.
    """
    a = np.asarray(alpha, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(a < 1, (1 - a ** (gamma + 1)) / (1 - a), gamma + 1.0)
    return float(e) if e.ndim == 0 else e


def expected_tokens_per_position(alphas) -> float:
    """Expected tokens per step when position i is accepted with conditional probability alphas[i].

    1 + sum_i prod_{j<=i} alphas[j]: the general form for acceptance that decays with position.
    """
    return 1.0 + float(np.cumprod(np.asarray(alphas, dtype=np.float64)).sum())


def speedup(alpha, gamma: int, c: float):
    """Expected walltime improvement (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    Assumes a target forward over gamma + 1 tokens costs as much as over one (memory-bound),
    and that one draft forward costs c target forwards.
    """
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def best_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """The gamma in 0..max_gamma with the largest expected speedup (0 means: do not speculate)."""
    return int(np.argmax([speedup(alpha, g, c) for g in range(max_gamma + 1)]))
