"""Lesson 10: typical acceptance (Medusa-2) is LOSSY, and the exactness test says so.

The same loop-law chi-squared test that block and token-wise verification pass
(test_10_block.py: the first L tokens of many speculative loops on toy Markov models against the
exact joint law, p < 1e-4 fails) must FAIL on typical acceptance, and the test reports the
total-variation distance it measured next to the tokens per step the rule buys. The rule is
registered under its own name only and is never picked unless asked for by name.
"""

import numpy as np
import pytest
import torch

from helpers import random_rows
from speclab import stats
from speclab.kernels import rejection_sample as kernels
from speclab.verify import LOSSY_RULES, RULES, block, get_rule, typical
from speclab.verify import rejection_sample as rejection_sample_by_name
from speclab.verify.backend import get_rejection_sampler
from speclab.verify.rejection import rejection_sample as token_wise
from test_10_block import L, N, SIGNIFICANCE, V, joint_pvalue, loop_counts, toy_pair

CASE = dict(seed=2, weight=0.7)  # a draft 70 % of the way to an unrelated chain
GAMMA = 4


def loop_tv_and_tokens(rule, g, target, draft):
    counts = loop_counts(rule, target, draft, GAMMA, g)
    return counts, stats.tv_distance(counts / counts.sum(), target.joint([0], L))


def test_the_exactness_test_fails_on_typical_acceptance():
    target, draft, g = toy_pair(**CASE)
    counts, tv = loop_tv_and_tokens(typical.rejection_sample, g, target, draft)
    pv = joint_pvalue(counts, target)
    floor = stats.min_detectable_tv(N, V ** L, SIGNIFICANCE)
    assert pv < SIGNIFICANCE, f"typical acceptance passed the exactness test (p={pv:.2e}, TV {tv:.4f})"
    assert tv > 2 * floor, f"measured TV {tv:.4f}: not clearly beyond what the test resolves ({floor:.3f})"
    for exact in (block.rejection_sample, token_wise):  # the same case, the same test: the exact rules pass
        counts, tv_exact = loop_tv_and_tokens(exact, g, target, draft)
        assert joint_pvalue(counts, target) > SIGNIFICANCE and tv_exact < tv / 3


def test_it_accepts_more_than_the_exact_rules_on_the_same_drafts():
    """What it buys: more drafts kept per step (the lesson plots this against the TV above)."""
    g = torch.Generator().manual_seed(3)
    n, k, Vb = 20_000, 4, 8
    p = random_rows(k + 1, Vb, g, spread=1.0).float()
    q = random_rows(k, Vb, g, spread=2.0).float()
    drafts = torch.multinomial(q, n, replacement=True, generator=g).T.reshape(-1)
    args = (drafts, [k] * n, p.repeat(n, 1), q.repeat(n, 1))
    mean = {name: float(((rule(*args, generator=g) >= 0).sum(1) - 1).double().mean())
            for name, rule in (("typical", typical.rejection_sample), ("block", block.rejection_sample),
                               ("standard", token_wise))}
    assert mean["typical"] > mean["block"] >= mean["standard"] - 0.02, mean


def test_threshold_by_hand():
    p = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.97, 0.01, 0.01, 0.01]], dtype=torch.float64)
    h = torch.tensor([-(0.5 * np.log(0.5) + 0.5 * np.log(0.25)), -(0.97 * np.log(0.97) + 0.03 * np.log(0.01))])
    torch.testing.assert_close(typical.entropy(p), h.double())
    want = torch.minimum(torch.tensor(0.09, dtype=torch.float64), 0.3 * torch.exp(-h.double()))
    torch.testing.assert_close(typical.typical_threshold(p), want)
    # accept iff p(x) > threshold: row 0's threshold is 0.09 (0.3 e^-H = 0.106), row 1's 0.3 e^-H = 0.26
    e = torch.ones(1, 4, dtype=torch.float64)
    for x, kept in ((1, True), (3, False)):
        pp = torch.stack([p[0], p[1]])
        out = typical.rejection_sample([x], [1], pp, None, uniforms=torch.tensor([0.5], dtype=torch.float64),
                                       noise=e)
        assert (out[0, 0] == x) == kept and (out[0, 1] >= 0) == kept


def test_it_ignores_q_and_ends_with_a_sample_of_p():
    g = torch.Generator().manual_seed(4)
    Vb, n = 6, 30_000
    p = torch.tensor([[0.3, 0.3, 0.2, 0.1, 0.05, 0.05], [0.2] * 5 + [0.0]], dtype=torch.float64)
    q1, q2 = random_rows(1, Vb, g), random_rows(1, Vb, g)
    drafts = torch.full((n,), 5)  # p_1(5) = 0.05 < 0.09: always refused
    a, b = (typical.rejection_sample(drafts, [1] * n, p.repeat(n, 1), q.repeat(n, 1),
                                     generator=torch.Generator().manual_seed(0)) for q in (q1, q2))
    assert torch.equal(a, b), "typical acceptance never reads q"
    assert (a[:, 1] == -1).all()
    assert stats.chi2_gof(np.bincount(a[:, 0].numpy(), minlength=Vb), p[0].numpy()) > SIGNIFICANCE
    # the lossy part: token 5 is drawn from p itself again, not from a residual that excludes the refused draft
    assert (a[:, 0] == 5).any()


def test_greedy_rows_are_the_greedy_rule():
    g = torch.Generator().manual_seed(5)
    B, k, Vb = 32, 3, 9
    p = random_rows(B * (k + 1), Vb, g)
    rows = torch.arange(B * k) + torch.arange(B).repeat_interleave(k)
    drafts = torch.where(torch.rand(B * k, generator=g) < 0.7, p[rows].argmax(-1), 0)
    args = dict(draft_token_ids=drafts, num_draft_tokens=[k] * B, target_probs=p,
                uniforms=torch.rand(B * k, generator=g, dtype=torch.float64).clamp(min=1e-300),
                noise=torch.empty(B, Vb, dtype=torch.float64).exponential_(generator=g))
    assert torch.equal(typical.rejection_sample(**args, greedy=True), token_wise(**args, greedy=True))


def test_named_lossy_and_refused_unless_asked_for_by_name():
    assert RULES["typical"] is typical.rejection_sample and get_rule("typical") is typical.rejection_sample
    assert LOSSY_RULES == ("typical",) and typical.LOSSY
    assert typical.__doc__.startswith("LOSSY") and "LOSSY" in typical.rejection_sample.__doc__
    exact = sorted(set(RULES) - set(LOSSY_RULES))
    assert exact == ["block", "standard"]
    assert "typical" not in kernels.RULES  # no kernel: the torch rule or a clear error, never silently
    assert get_rejection_sampler("torch", method="typical") is typical.rejection_sample
    assert get_rejection_sampler("auto", method="typical") is typical.rejection_sample
    with pytest.raises(RuntimeError, match="SPECLAB_VERIFIER=torch"):
        get_rejection_sampler("triton", method="typical")
    # the default rule is the standard one: a batch where the two differ
    g = torch.Generator().manual_seed(6)
    p, q = random_rows(4, 5, g), random_rows(3, 5, g)
    drafts = torch.multinomial(q, 1, generator=g).flatten().repeat(200)
    args = (drafts, [3] * 200, p.repeat(200, 1), q.repeat(200, 1))
    default = rejection_sample_by_name(*args, generator=torch.Generator().manual_seed(1))
    assert torch.equal(default, token_wise(*args, generator=torch.Generator().manual_seed(1)))
    assert not torch.equal(default, rejection_sample_by_name(*args, generator=torch.Generator().manual_seed(1),
                                                             method="typical"))


def test_bad_parameters():
    with pytest.raises(ValueError, match="posterior_threshold"):
        typical.rejection_sample([0], [1], torch.full((2, 2), 0.5), None, posterior_threshold=0.0)


def test_asking_for_typical_by_name_warns_that_it_is_lossy():
    from speclab.spec_config import SpeculativeConfig
    with pytest.warns(UserWarning, match="LOSSY"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "typical"})
