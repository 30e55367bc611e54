"""Grades exercise 01 (one verification step). `pytest --impl=exercises tests/test_ex01_rejection_sampling.py`."""

import numpy as np
import pytest
import torch

from helpers import counts_by_position, random_rows
from speclab import stats
from speclab.verify import verify_greedy_step, verify_step

EXERCISE = "ex01_rejection_sampling"
pytestmark = pytest.mark.exercise


def test_acceptance_probability(impl):
    assert impl.acceptance_probability(0.2, 0.4) == pytest.approx(0.5)
    assert impl.acceptance_probability(0.6, 0.3) == 1.0
    assert impl.acceptance_probability(0.0, 0.3) == 0.0
    assert impl.acceptance_probability(0.5, 0.0) == 0.0


def test_residual_distribution(impl):
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.4, 0.0, 0.4])
    assert impl.residual_distribution(p, q).tolist() == pytest.approx([0.6, 0.0, 0.4, 0.0])
    assert impl.residual_distribution(p, p.clone()).tolist() == pytest.approx(p.tolist())


def test_verify_accepts_the_same_drafts_as_speclab(impl):
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        k = int(torch.randint(1, 6, (1,), generator=g))
        p, q = random_rows(k + 1, 7, g), random_rows(k, 7, g)
        drafts = torch.multinomial(q, 1, generator=g).flatten().tolist()
        u = torch.rand(k, dtype=torch.float64, generator=g).clamp(min=1e-12)
        mine = impl.verify(drafts, p, q, u, generator=g)
        ref = verify_step(drafts, p, q, uniforms=u, generator=g)
        assert 1 <= len(mine) <= k + 1
        assert mine[:-1] == ref[:-1], "accepted drafts differ from speclab.verify.verify_step with the same uniforms"


def test_verify_emits_the_target_distribution(impl):
    """Every emitted position follows p (chi-squared, p < 1e-4 fails; detects TV >= ~0.04 per position)."""
    g = torch.Generator().manual_seed(1)
    V, k, N = 6, 3, 15_000
    p, q = random_rows(k + 1, V, g), random_rows(k, V, g)
    outs = []
    for _ in range(N):
        drafts = torch.multinomial(q, 1, generator=g).flatten().tolist()
        outs.append(impl.verify(drafts, p, q, torch.rand(k, dtype=torch.float64, generator=g), generator=g))
    counts = counts_by_position(outs, k, V)
    pv = stats.chi2_gof_strata(list(counts), list(p.numpy()))
    assert pv > 1e-4, f"your verifier's output is not the target distribution (p={pv:.1e}): check the residual and the bonus"
    assert counts[k].sum() > 0, "the bonus position was never reached"


def test_verify_samples_the_bonus_token(impl):
    """With p == q every draft is accepted; the bonus must be *sampled* from p[k], not its argmax."""
    g = torch.Generator().manual_seed(2)
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    bonus = [impl.verify([0], p, p[:1], torch.tensor([0.9], dtype=torch.float64), generator=g)[-1] for _ in range(2000)]
    assert 0.4 < np.mean(bonus) < 0.6


def test_verify_greedy(impl):
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        k = int(torch.randint(0, 5, (1,), generator=g))
        p = random_rows(k + 1, 5, g)
        drafts = [int(x) for x in torch.randint(0, 5, (k,), generator=g)]
        drafts[: k // 2] = p[: k // 2].argmax(-1).tolist()
        assert impl.verify_greedy(drafts, p) == verify_greedy_step(drafts, p)
