"""Speculative verification emits exactly the target's distribution (token level).

Every test here is seeded and uses a strict threshold: a p-value below SIGNIFICANCE fails.
Each one states the smallest total-variation distance it detects with power 0.99
(speclab.stats.min_detectable_tv), and the mutants of tests/mutants.py, classic broken
verifiers, must fail the same test (the negative controls at the bottom).
"""

import numpy as np
import pytest
import torch

from mutants import MUTANTS
from helpers import random_rows, sample_batched, sample_verifier
from speclab import stats
from speclab.verify import rejection_sample, verify_step

pytestmark = pytest.mark.slow  # statistical: many thousand samples per test

SIGNIFICANCE = 1e-4
N_BATCHED = 40_000  # rejection_sample draws
N_LOOP = 12_000  # verify_step draws (a Python loop)


def position_pvalue(counts: np.ndarray, p: torch.Tensor) -> float:
    """One chi-squared test of 'emitted position j follows p_j' over all positions j."""
    return stats.chi2_gof_strata(list(counts), list(p.numpy()))


def assert_matches_target(counts, p, n, label=""):
    first = stats.chi2_gof(counts[0], p[0].numpy())
    every = position_pvalue(counts, p)
    tv = stats.min_detectable_tv(n, p.shape[-1], SIGNIFICANCE)
    assert first > SIGNIFICANCE and every > SIGNIFICANCE, (
        f"{label}: emitted tokens differ from the target (first-token p={first:.2e}, all positions "
        f"p={every:.2e}; this test detects TV >= {tv:.3f} on the first token)")


def make_case(V, k, seed, zero_frac=0.0, spread=1.5):
    g = torch.Generator().manual_seed(seed)
    p = random_rows(k + 1, V, g, spread)
    q = random_rows(k, V, g, spread, zero_frac) if k else torch.empty(0, V, dtype=torch.float64)
    return p, q, g


# ----------------------------------------------------------------------------------------------
# The batched verifier over many shapes (first token detects TV >= ~0.02-0.04 at N = 40k)


@pytest.mark.parametrize("V", [2, 7, 33, 257])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_batched_matches_target(V, k):
    p, q, g = make_case(V, k, seed=1000 * V + k)
    assert_matches_target(sample_batched(p, q, N_BATCHED, g), p, N_BATCHED, f"V={V} k={k}")


@pytest.mark.parametrize("k", [2, 4, 5, 6, 7])
def test_batched_matches_target_every_k(k):
    p, q, g = make_case(11, k, seed=k)
    assert_matches_target(sample_batched(p, q, N_BATCHED, g), p, N_BATCHED, f"k={k}")


def test_q_zero_on_part_of_p_support():
    """Tokens the draft never proposes can only come from the residual; they still get p's mass."""
    p, q, g = make_case(13, 4, seed=7, zero_frac=0.6)
    assert ((q == 0) & (p[:-1] > 0)).any()
    assert_matches_target(sample_batched(p, q, N_BATCHED, g), p, N_BATCHED)


def test_p_one_hot():
    p, q, g = make_case(9, 3, seed=8)
    p = torch.zeros_like(p)
    p[torch.arange(4), torch.tensor([2, 5, 0, 8])] = 1.0
    counts = sample_batched(p, q, N_BATCHED, g)
    assert_matches_target(counts, p, N_BATCHED)
    assert counts[0, 2] == N_BATCHED  # deterministic target: every sample emits token 2 first


def test_p_equals_q_accepts_everything():
    p, _, g = make_case(10, 5, seed=9)
    counts = sample_batched(p, p[:-1].clone(), N_BATCHED, g)
    assert (counts.sum(1) == N_BATCHED).all(), "with p == q every draft must be accepted"
    assert_matches_target(counts, p, N_BATCHED)


def test_one_hot_drafts_from_a_deterministic_proposer():
    """draft_probs=None (n-gram drafts): accept with p(x), else sample p with x removed."""
    p, _, g = make_case(12, 4, seed=10)
    fixed = [int(p[0].argmax()), 3, 3, 0]
    assert_matches_target(sample_batched(p, None, N_BATCHED, g, one_hot_drafts=fixed), p, N_BATCHED)


def test_float64_inputs():
    p, q, g = make_case(17, 3, seed=11)
    assert_matches_target(sample_batched(p, q, N_BATCHED, g, dtype=torch.float64), p, N_BATCHED)


def test_ragged_batch_each_request_follows_its_own_target():
    """Requests with k = 0, 2, 5 and different targets interleaved in one call."""
    g = torch.Generator().manual_seed(12)
    V, ks, n = 9, [0, 2, 5], 15_000
    ps = [random_rows(k + 1, V, g) for k in ks]
    qs = [random_rows(k, V, g) if k else torch.empty(0, V, dtype=torch.float64) for k in ks]
    drafts, targets, draft_probs, num = [], [], [], []
    for _ in range(n):
        for k, p, q in zip(ks, ps, qs):
            if k:
                drafts.append(torch.multinomial(q, 1, generator=g).flatten())
                draft_probs.append(q)
            targets.append(p)
            num.append(k)
    out = rejection_sample(torch.cat(drafts), num, torch.cat(targets).float(), torch.cat(draft_probs).float(),
                           generator=g)
    out = out.reshape(n, len(ks), -1)
    for r, (k, p) in enumerate(zip(ks, ps)):
        counts = np.stack([torch.bincount(out[:, r, j][out[:, r, j] >= 0], minlength=V).numpy()
                           for j in range(k + 1)])
        assert_matches_target(counts, p, n, f"request with k={k}")
        assert (out[:, r, k + 1:] == -1).all()


# ----------------------------------------------------------------------------------------------
# The readable one-sequence verifier (first token detects TV >= ~0.05 at N = 12k)


@pytest.mark.parametrize("V,k", [(5, 1), (8, 3), (23, 6)])
def test_verify_step_matches_target(V, k):
    p, q, g = make_case(V, k, seed=77 + V)
    assert_matches_target(sample_verifier(verify_step, p, q, N_LOOP, g), p, N_LOOP)


def test_verify_step_with_one_hot_drafts():
    p, _, g = make_case(6, 2, seed=78)
    counts = sample_verifier(verify_step, p, None, N_LOOP, g, drafts=[1, 4])
    assert_matches_target(counts, p, N_LOOP)


# ----------------------------------------------------------------------------------------------
# Acceptance: empirical rate ~ beta = sum min(p, q); tokens per step ~ the closed form


def test_acceptance_rate_and_tokens_per_step_match_theory():
    g = torch.Generator().manual_seed(13)
    V, k, N = 16, 4, N_BATCHED
    p_row, q_row = random_rows(1, V, g), random_rows(1, V, g)
    p, q = p_row.repeat(k + 1, 1), q_row.repeat(k, 1)  # the same p, q at every position: i.i.d. alpha
    alpha = float(stats.acceptance_prob(p_row[0], q_row[0]))
    counts = sample_batched(p, q, N, g)
    emitted = counts.sum(1)  # samples that reached each position
    accepted_first = emitted[1]  # position 1 is reached iff draft 1 was accepted
    z = (accepted_first - N * alpha) / np.sqrt(N * alpha * (1 - alpha))
    assert abs(z) < 4.5, f"acceptance {accepted_first / N:.4f} vs beta = sum min(p, q) = {alpha:.4f}"
    # tokens per step: mean of 1 + accepted, against (1 - alpha^(k+1)) / (1 - alpha)
    lengths = np.repeat(np.arange(1, k + 2), -np.diff(np.append(emitted, 0)))
    z = (lengths.mean() - stats.expected_tokens(alpha, k)) / (lengths.std() / np.sqrt(N))
    assert abs(z) < 4.5, f"tokens/step {lengths.mean():.4f} vs closed form {stats.expected_tokens(alpha, k):.4f}"


# ----------------------------------------------------------------------------------------------
# Negative controls: the same tests must reject broken verifiers


MUTANT_CASE = dict(V=8, k=3, seed=2024)  # TV(p, q) ~ 0.3: rejections and bonus tokens both frequent


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_token_level_test_rejects_mutant(name):
    p, q, g = make_case(**MUTANT_CASE)
    counts = sample_verifier(MUTANTS[name], p, q, N_LOOP, g)
    assert position_pvalue(counts, p) < SIGNIFICANCE, f"the token-level test cannot see the bug in {name}"


def test_mutant_case_passes_with_the_real_verifier():
    """The configuration used for the mutants is one the real verifier passes."""
    p, q, g = make_case(**MUTANT_CASE)
    assert_matches_target(sample_verifier(verify_step, p, q, N_LOOP, g), p, N_LOOP)


def test_acceptance_test_rejects_deterministic_acceptance():
    """Accepting iff p >= q has acceptance sum_{p>=q} q, not sum min(p, q)."""
    p, q, g = make_case(**MUTANT_CASE)
    N = N_LOOP
    counts = sample_verifier(MUTANTS["accept_if_p_ge_q"], p, q, N, g)
    alpha = float(stats.acceptance_prob(p[0], q[0]))
    z = (counts[1].sum() - N * alpha) / np.sqrt(N * alpha * (1 - alpha))
    assert abs(z) > 4.5
