"""The speculative loop emits sequences with exactly the target's joint distribution.

Toy Markov "language models" have a known joint law over the next L tokens, so the loop
(several draft-verify rounds, bonus tokens, gamma shrinking at the end) is tested against exact
probabilities with a chi-squared test over all V^L sequences. Broken verifiers must fail it.
"""

import numpy as np
import pytest
import torch

from mutants import MUTANTS
from speclab import stats
from speclab.metrics import SpecDecodingStats
from speclab.reference import autoregressive_generate, speculative_generate, speculative_step
from speclab.toy import MarkovLM
from speclab.verify import rejection_sample

pytestmark = pytest.mark.slow  # statistical: many thousand samples per test

SIGNIFICANCE = 1e-4
# 64 sequences; N = 10k detects TV >= 0.050 over the joint law with power 0.99 at p < 1e-4
# (stats.min_detectable_tv(10_000, 64); 20k detected 0.035 at twice the time). The mutants below sit at
# TV 0.04-0.32 from the target (measured at N = 20k) and still fail with p < 1e-68 at N = 10k (the bound
# is worst-case: chi2 sees one_uniform_for_all at TV ~0.04 with p ~ 1e-168).
V, L, N = 4, 3, 10_000


def toy_pair(seed: int, weight: float = 0.5, zero_frac: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    target = MarkovLM.random(V, g, spread=1.5)
    draft = target.blend(MarkovLM.random(V, g, spread=2.0, zero_frac=zero_frac), weight)
    return target, draft, g


def joint_counts(generate, n: int) -> np.ndarray:
    counts = np.zeros((V,) * L, dtype=np.int64)
    for _ in range(n):
        counts[tuple(generate())] += 1
    return counts


def joint_pvalue(target, prefix, generate, n=N) -> float:
    return stats.chi2_gof(joint_counts(generate, n).ravel(), target.joint(prefix, L).ravel().numpy())


def batched_verify(drafts, p, q=None, *, uniforms=None, generator=None):
    """`rejection_sample` behind `verify_step`'s signature, for use inside the loop."""
    out = rejection_sample(torch.tensor(drafts, dtype=torch.long), [len(drafts)], p, q,
                           uniforms=uniforms, generator=generator)[0]
    return out[out >= 0].tolist()


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_joint_law_of_three_tokens_matches_target(gamma):
    target, draft, g = toy_pair(seed=gamma)
    pv = joint_pvalue(target, [1], lambda: speculative_generate(target, draft, [1], L, gamma, generator=g))
    assert pv > SIGNIFICANCE, f"gamma={gamma}: joint law differs from the target (p={pv:.2e}; detects TV >= " \
                              f"{stats.min_detectable_tv(N, V ** L):.3f})"


def test_joint_law_with_draft_blind_to_some_tokens():
    target, draft, g = toy_pair(seed=5, weight=1.0, zero_frac=0.5)  # an unrelated draft
    assert (draft.transition == 0).any()
    pv = joint_pvalue(target, [0], lambda: speculative_generate(target, draft, [0], L, 3, generator=g))
    assert pv > SIGNIFICANCE


def test_joint_law_through_the_batched_verifier():
    target, draft, g = toy_pair(seed=6)
    gen = lambda: speculative_generate(target, draft, [2], L, 2, generator=g, verify=batched_verify)  # noqa: E731
    assert joint_pvalue(target, [2], gen) > SIGNIFICANCE


def test_direct_sampling_passes_the_same_test():
    """Calibration: plain autoregressive samples pass the joint test (the test is not too strict)."""
    target, _, g = toy_pair(seed=7)
    assert joint_pvalue(target, [3], lambda: autoregressive_generate(target, [3], L, generator=g)) > SIGNIFICANCE


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_joint_test_rejects_mutant(name):
    target, draft, g = toy_pair(seed=8)
    gen = lambda: speculative_generate(target, draft, [1], L, 2, generator=g, verify=MUTANTS[name])  # noqa: E731
    assert joint_pvalue(target, [1], gen) < SIGNIFICANCE, f"the sequence-level test cannot see the bug in {name}"


def test_greedy_speculative_equals_greedy_target():
    for seed in range(5):
        target, draft, _ = toy_pair(seed=seed, weight=0.7)
        for gamma in (0, 1, 3, 8):
            assert speculative_generate(target, draft, [seed % V], 40, gamma, greedy=True) == \
                autoregressive_generate(target, [seed % V], 40, greedy=True)


def test_step_emits_between_one_and_gamma_plus_one_tokens():
    target, draft, g = toy_pair(seed=9)
    lengths = {len(speculative_step(target, draft, [0], 3, generator=g)) for _ in range(300)}
    assert lengths <= {1, 2, 3, 4} and len(lengths) > 1


def test_loop_stops_at_max_new_tokens_and_counts_match():
    target, draft, g = toy_pair(seed=10)
    st = SpecDecodingStats(num_speculative_tokens=5)
    for n in (1, 2, 7, 13):
        assert len(speculative_generate(target, draft, [0], n, 5, generator=g, stats=st)) == n
    assert st.num_draft_tokens >= st.num_accepted_tokens == sum(st.num_accepted_tokens_per_pos)


def test_tokens_per_step_matches_theory_with_iid_acceptance():
    """With context-free p and q (every row alike), tokens per step -> (1 - alpha^(g+1)) / (1 - alpha)."""
    g = torch.Generator().manual_seed(11)
    p_row = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64)
    q_row = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    target, draft = MarkovLM(p_row.repeat(V, 1), p_row), MarkovLM(q_row.repeat(V, 1), q_row)
    alpha, gamma = float(stats.acceptance_prob(p_row, q_row)), 4
    st = SpecDecodingStats(gamma)
    for _ in range(4000):
        speculative_step_len = len(speculative_step(target, draft, [0], gamma, generator=g))
        st.observe(gamma, speculative_step_len - 1)
    expected = stats.expected_tokens(alpha, gamma)
    assert abs(st.mean_acceptance_length - expected) < 0.05 * expected
    assert abs(st.acceptance_per_pos()[0] - alpha) < 0.03


def test_alpha_from_counters_estimates_beta_for_every_gamma():
    """Counters give alpha = accepted / positions tested; with i.i.d. rows it estimates sum min(p, q)."""
    g = torch.Generator().manual_seed(12)
    p_row = torch.tensor([0.6, 0.2, 0.1, 0.1], dtype=torch.float64)
    q_row = torch.tensor([0.3, 0.3, 0.2, 0.2], dtype=torch.float64)
    target, draft = MarkovLM(p_row.repeat(V, 1), p_row), MarkovLM(q_row.repeat(V, 1), q_row)
    beta = float(stats.acceptance_prob(p_row, q_row))
    for gamma in (1, 3, 6):
        st = SpecDecodingStats(gamma)
        speculative_generate(target, draft, [0], 6000, gamma, generator=g, stats=st)
        tested = st.num_accepted_tokens / st.alpha
        z = (st.alpha - beta) / np.sqrt(beta * (1 - beta) / tested)
        assert abs(z) < 4.5, f"gamma={gamma}: alpha {st.alpha:.3f} vs beta {beta:.3f}"
        assert st.acceptance_rate < st.alpha or gamma == 1
