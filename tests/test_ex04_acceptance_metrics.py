"""Grades exercise 04 (spec-decode counters). `pytest --impl=exercises tests/test_ex04_acceptance_metrics.py`."""

import random

import pytest

from speclab.metrics import SpecDecodingStats

EXERCISE = "ex04_acceptance_metrics"
pytestmark = pytest.mark.exercise


def new_counters(k: int) -> dict:
    return {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": [0] * k,
            "num_positions_tested": 0}


def test_observe_by_hand(impl):
    c = new_counters(4)
    impl.observe(c, 4, 2)
    impl.observe(c, 4, 4)
    impl.observe(c, 0, 0)  # a step without drafts is not counted
    impl.observe(c, 3, 0)
    assert c == {"num_drafts": 3, "num_draft_tokens": 11, "num_accepted_tokens": 6,
                 "num_accepted_tokens_per_pos": [2, 2, 1, 1], "num_positions_tested": 3 + 4 + 1}


def test_rates_by_hand(impl):
    c = {"num_drafts": 3, "num_draft_tokens": 12, "num_accepted_tokens": 6, "num_accepted_tokens_per_pos": [2, 2, 1, 1],
         "num_positions_tested": 8}
    assert impl.acceptance_rate(c) == pytest.approx(6 / 12)
    assert impl.mean_acceptance_length(c) == pytest.approx(1 + 6 / 3)
    assert impl.alpha(c) == pytest.approx(6 / (3 + 2 + 2 + 1))  # tested: 3 at pos 0, then 2, 2, 1


def test_empty_counters(impl):
    c = new_counters(3)
    assert impl.acceptance_rate(c) == 0.0 and impl.alpha(c) == 0.0
    assert impl.mean_acceptance_length(c) == 1.0


def test_alpha_differs_from_acceptance_rate(impl):
    c = new_counters(4)
    for _ in range(10):
        impl.observe(c, 4, 1)  # always accept one, reject the second
    assert impl.alpha(c) == pytest.approx(0.5) and impl.acceptance_rate(c) == pytest.approx(0.25)


@pytest.mark.parametrize("seed", range(20))
def test_matches_speclab_on_random_steps(impl, seed):
    rng = random.Random(seed)
    k = rng.randint(1, 8)
    c, ref = new_counters(k), SpecDecodingStats(k)
    for _ in range(rng.randint(1, 200)):
        drafted = rng.choice([k, k, k, rng.randint(0, k)])
        accepted = min(drafted, int(rng.expovariate(0.5)))
        impl.observe(c, drafted, accepted)
        ref.observe(drafted, accepted)
    assert {key: c[key] for key in ref.as_dict() if key in c} == {key: v for key, v in ref.as_dict().items() if key in c}
    assert impl.acceptance_rate(c) == pytest.approx(ref.acceptance_rate)
    assert impl.mean_acceptance_length(c) == pytest.approx(ref.mean_acceptance_length)
    assert impl.alpha(c) == pytest.approx(ref.alpha)
