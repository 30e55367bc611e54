"""sampling: temperature/top-k/top-p; stats: the tests are calibrated and the formulas are right."""

import numpy as np
import pytest
import torch

from speclab import stats
from speclab.metrics import SpecDecodingStats
from speclab.sampling import apply_top_k, apply_top_p, check_probs, logits_to_probs, sample, sample_cdf


def test_temperature_one_is_softmax_and_zero_is_one_hot():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, -1.0]])
    assert torch.allclose(logits_to_probs(logits), logits.softmax(-1))
    assert logits_to_probs(logits, temperature=0.0).tolist() == [[0, 1, 0], [1, 0, 0]]
    per_row = logits_to_probs(logits, temperature=torch.tensor([0.0, 2.0]))
    assert per_row[0].tolist() == [0, 1, 0] and torch.allclose(per_row[1], (logits[1] / 2).softmax(-1))


def test_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))
    assert (apply_top_k(logits, 2).isinf() == torch.tensor([[True, False, True, False]])).all()
    assert torch.equal(apply_top_k(logits, 0), logits) and torch.equal(apply_top_k(logits, -1), logits)
    # top_p = 0.6: 0.4 alone is short of 0.6, 0.4 + 0.3 reaches it -> keep {1, 3}
    assert logits_to_probs(logits, top_p=0.6)[0].tolist() == pytest.approx([0, 4 / 7, 0, 3 / 7])
    assert logits_to_probs(logits, top_p=0.4)[0].tolist() == pytest.approx([0, 1, 0, 0])
    assert logits_to_probs(logits, top_p=1e-6)[0].tolist() == pytest.approx([0, 1, 0, 0])  # top-1 always kept
    assert logits_to_probs(logits, top_k=3, top_p=0.8)[0].tolist() == pytest.approx([0, 4 / 9, 2 / 9, 3 / 9])
    rows = apply_top_p(logits.repeat(2, 1), torch.tensor([1.0, 0.4]))
    assert not rows[0].isinf().any() and rows[1].isinf().sum() == 3


def test_bad_settings_and_non_distributions_are_refused():
    with pytest.raises(ValueError, match="temperature"):
        logits_to_probs(torch.zeros(3), temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        logits_to_probs(torch.zeros(3), top_p=0.0)
    with pytest.raises(ValueError, match="NaN"):
        check_probs(torch.tensor([float("nan"), 1.0]))
    with pytest.raises(ValueError, match="sums to"):
        check_probs(torch.tensor([0.5, 0.6]))


def test_the_cheap_checks_still_name_each_problem():
    """check_probs reads a row cheaply first (a sum, a min, a float32 sum): each problem still gets its
    own message, and probabilities so large that their sum overflows are not called inf."""
    with pytest.raises(ValueError, match="NaN or inf"):
        check_probs(torch.tensor([[0.5, 0.5], [float("inf"), 0.0]]))
    with pytest.raises(ValueError, match="negative"):
        check_probs(torch.tensor([[1.5, -0.5]]))
    with pytest.raises(ValueError, match="row 1 sums to 1.01"):
        check_probs(torch.tensor([[0.5, 0.5], [0.5, 0.51]]))
    with pytest.raises(ValueError, match="sums to"):  # finite, but the float32 sum overflows
        check_probs(torch.tensor([3e38, 3e38]))
    check_probs(torch.softmax(torch.randn(5, 49152), -1))   # a verify step's rows pass


def test_inverse_cdf_sampling_follows_the_law_and_never_draws_a_zero():
    """sample_cdf, the engine's drafting sampler, against the exact law: 20,000 draws over 30 cells
    (a third of them zero, the first and last included), chi-squared at p < 1e-4, which detects
    every TV distance >= stats.min_detectable_tv(20000, 20) (about 0.036) with power 0.99. Negative
    control: the same test rejects torch.multinomial's draws from a law 0.1 away in TV."""
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(30, generator=g, dtype=torch.float64)
    probs[::3] = 0
    probs /= probs.sum()
    draws = sample_cdf(probs.float().expand(20000, 30).contiguous(), torch.Generator().manual_seed(1))
    counts = np.bincount(draws.numpy(), minlength=30)
    assert counts[probs.numpy() == 0].sum() == 0
    assert stats.chi2_gof(counts[probs.numpy() > 0], probs.numpy()[probs.numpy() > 0]) > 1e-4
    assert stats.min_detectable_tv(20000, 20) < 0.04
    wrong = probs.clone()
    wrong[1] += 0.1
    wrong /= wrong.sum()
    other = torch.multinomial(wrong.float(), 20000, replacement=True, generator=torch.Generator().manual_seed(2))
    other_counts = np.bincount(other.numpy(), minlength=30)
    assert stats.chi2_gof(other_counts[probs.numpy() > 0], probs.numpy()[probs.numpy() > 0]) < 1e-4
    one = torch.zeros(49152)
    one[49151] = 1.0                                          # all the mass on the last token
    assert int(sample_cdf(one, torch.Generator().manual_seed(3))) == 49151
    assert torch.equal(sample_cdf(probs.float(), torch.Generator().manual_seed(4)),
                       sample_cdf(probs.float(), torch.Generator().manual_seed(4)))


def test_seeded_sampling_is_reproducible():
    p = torch.full((4, 10), 0.1)
    draw = lambda s: sample(p, torch.Generator().manual_seed(s))  # noqa: E731
    assert torch.equal(draw(0), draw(0)) and draw(0).shape == (4,)


def test_chi2_gof_is_calibrated_and_has_power():
    """Under the null the p-values are ~uniform; at the stated TV the test almost always rejects."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(10))
    pvals = np.array([stats.chi2_gof(rng.multinomial(2000, probs), probs) for _ in range(400)])
    assert 0.05 < (pvals < 0.1).mean() < 0.16  # ~10% of null p-values fall below 0.1
    tv = stats.min_detectable_tv(2000, 10, significance=1e-4, power=0.99)
    shifted = probs.copy()
    shifted[np.argmax(probs)] -= tv
    shifted[np.argmin(probs)] += tv  # an alternative exactly tv away
    rejected = [stats.chi2_gof(rng.multinomial(2000, shifted), probs) < 1e-4 for _ in range(200)]
    assert np.mean(rejected) > 0.95


def test_chi2_zero_cells_and_two_sample():
    assert stats.chi2_gof([5, 0, 1], [0.5, 0.5, 0.0]) == 0.0  # an impossible cell was observed
    assert stats.chi2_gof([7, 0], [1.0, 0.0]) == 1.0
    rng = np.random.default_rng(1)
    a, b = rng.multinomial(5000, [0.2, 0.3, 0.5]), rng.multinomial(5000, [0.2, 0.3, 0.5])
    c = rng.multinomial(5000, [0.3, 0.3, 0.4])
    assert stats.chi2_two_sample(a, b) > 1e-4 > stats.chi2_two_sample(a, c)


def test_min_detectable_tv_and_samples_for_tv_are_inverse():
    n = stats.samples_for_tv(0.05, 8, significance=1e-3)
    assert 4000 < n < 5000  # ~4.5k for df = 7, alpha = 1e-3, power 0.99
    assert stats.min_detectable_tv(n, 8, significance=1e-3) == pytest.approx(0.05, rel=1e-3)


def test_theory_formulas():
    assert stats.expected_tokens(0.0, 5) == 1.0
    assert stats.expected_tokens(1.0, 5) == 6.0
    assert stats.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert stats.expected_tokens_per_position([0.5, 0.5]) == pytest.approx(1.75)
    assert stats.speedup(0.8, 8, 0.05) == pytest.approx(3.09, abs=0.01)  # Leviathan et al., Table: c=0.05
    assert stats.best_gamma(0.8, 0.05) == 8
    assert stats.best_gamma(0.5, 0.2) == 1
    assert stats.best_gamma(0.1, 0.5) == 0  # alpha < c: speculation cannot pay
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.25, 0.5])
    assert float(stats.acceptance_prob(p, q)) == pytest.approx(0.5) == 1 - stats.tv_distance(p, q)


def test_metrics_counters():
    st = SpecDecodingStats(num_speculative_tokens=3)
    st.observe(3, 2)
    st.observe(3, 0)
    st.observe(0, 0)  # no drafts: not a draft
    assert st.as_dict()["num_accepted_tokens_per_pos"] == [1, 1, 0]
    assert st.num_drafts == 2 and st.acceptance_rate == pytest.approx(2 / 6)
    assert st.mean_acceptance_length == pytest.approx(2.0)
    assert st.alpha == pytest.approx(2 / 4)  # positions tested: 3 in the first step, 1 in the second
    with pytest.raises(ValueError):
        st.observe(2, 3)
    short = SpecDecodingStats(num_speculative_tokens=8)
    short.observe(2, 2)  # a short draft (n-gram found only 2 tokens), fully accepted: 2 positions tested
    short.observe(8, 1)
    assert short.alpha == pytest.approx(3 / (2 + 2))
    short.reset()
    assert short.as_dict()["num_drafts"] == 0 and short.alpha == 0.0
