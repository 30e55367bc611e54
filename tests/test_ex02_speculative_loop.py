"""Grades exercise 02 (theory and one loop step). `pytest --impl=exercises tests/test_ex02_speculative_loop.py`."""

import numpy as np
import pytest
import torch

from speclab import stats
from speclab.toy import MarkovLM

EXERCISE = "ex02_speculative_loop"
pytestmark = pytest.mark.exercise


def test_expected_tokens(impl):
    for alpha in (0.0, 0.3, 0.75, 0.999):
        for gamma in (0, 1, 4, 10):
            assert impl.expected_tokens(alpha, gamma) == pytest.approx(stats.expected_tokens(alpha, gamma))
    assert impl.expected_tokens(1.0, 4) == 5.0


def test_speedup_and_best_gamma(impl):
    assert impl.speedup(0.8, 8, 0.05) == pytest.approx(3.09, abs=0.01)
    assert impl.speedup(0.0, 0, 0.5) == 1.0
    for alpha, c in [(0.5, 0.01), (0.6, 0.05), (0.8, 0.1), (0.9, 0.2), (0.1, 0.5)]:
        assert impl.best_gamma(alpha, c) == stats.best_gamma(alpha, c, max_gamma=32)


def test_speculative_step_joint_law(impl):
    """Two rounds from one prefix produce the target's joint law over 2 tokens (p < 1e-4 fails)."""
    g = torch.Generator().manual_seed(4)
    V = 4
    target = MarkovLM.random(V, g, spread=1.5)
    draft = target.blend(MarkovLM.random(V, g), 0.6)
    counts = np.zeros((V, V))
    for _ in range(8000):
        out = impl.speculative_step(target, draft, [0], 1, generator=g)
        if len(out) == 1:
            out += impl.speculative_step(target, draft, [0] + out, 0, generator=g)
        counts[out[0], out[1]] += 1
    pv = stats.chi2_gof(counts.ravel(), target.joint([0], 2).ravel().numpy())
    assert pv > 1e-4, f"speculative_step does not preserve the target distribution (p={pv:.1e})"


def test_speculative_step_calls_the_draft_gamma_times(impl):
    g = torch.Generator().manual_seed(5)
    target = MarkovLM.random(5, g)
    calls = []
    draft = lambda toks: calls.append(list(toks)) or target(toks)  # noqa: E731
    out = impl.speculative_step(target, draft, [1, 2], 3, generator=g)
    assert len(calls) == 3 and calls[0] == [1, 2] and len(calls[2]) == 4
    # the draft is the target itself (p == q), so all 3 drafts are accepted and a bonus follows
    assert len(out) == 4 and out[:2] == calls[2][2:]
