"""Grades exercise 04 (greedy / probabilistic drafting; counters for variable-length drafts).
`pytest --impl=exercises tests/test_ex04_acceptance_metrics.py`. Negative controls at the bottom
grade the grader (skipped under --impl=exercises)."""

import math
import random

import numpy as np
import pytest
import torch

from speclab import stats
from speclab.metrics import SpecDecodingStats
from speclab.toy import MarkovLM
from speclab.verify import verify_step
from tests.helpers import fail_on

EXERCISE = "ex04_acceptance_metrics"
pytestmark = pytest.mark.exercise


def new_counters(k: int) -> dict:
    return {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
            "num_accepted_tokens_per_pos": [0] * k, "num_draft_tokens_per_pos": [0] * k, "num_positions_tested": 0}


# ---------------------------------------------------------------------------------------------
# Drafting


def pair(seed=0, V=5):
    g = torch.Generator().manual_seed(seed)
    target = MarkovLM.random(V, g, spread=1.0)  # a spread-out target: greedy drafting loses here
    return target, target.blend(MarkovLM.random(V, g, spread=1.0), 0.3), g


def check_shapes(draft_fn):
    target, dm, g = pair()
    drafts, q = draft_fn(dm, [2], 3, "greedy", generator=g)
    ctx, want = [2], []
    for _ in range(3):
        want.append(int(dm(ctx).argmax())); ctx.append(want[-1])
    if drafts != want:
        return f"greedy drafting from [2] takes argmax q at each step, fed back as context: want {want}, got {drafts}"
    if q is not None:
        return ("greedy drafts are deterministic, so the verifier must treat them as one-hot: return q = None "
                "(passing the draft's soft q for an argmax draft makes the output wrong)")
    drafts, q = draft_fn(dm, [2], 3, "probabilistic", generator=g)
    if q is None or tuple(q.shape) != (3, 5):
        return f"probabilistic drafting returns the (k, V) = (3, 5) distributions the drafts were sampled from, got {q}"
    for i in range(3):
        if not torch.allclose(q[i], dm([2] + drafts[:i])):
            return f"row {i} of q must be the draft's distribution after [2] + drafts[:{i}] = {[2] + drafts[:i]}"
    return None


def check_law(draft_fn, method, N=6000):
    """The first token of one step (k = 2) must follow the target (chi-squared, p < 1e-4 fails)."""
    target, dm, g = pair(1)
    counts = np.zeros(5)
    for _ in range(N):
        drafts, q = draft_fn(dm, [0], 2, method, generator=g)
        p = torch.stack([target([0] + drafts[:i]) for i in range(3)])
        counts[verify_step(drafts, p, q, generator=g)[0]] += 1
    pv = stats.chi2_gof(counts, target([0]).numpy())
    if pv > 1e-4:
        return None
    return (f"{method} drafting: the first emitted token is not distributed as the target (chi2 p={pv:.1e}, "
            f"TV={stats.tv_distance(counts / N, target([0])):.3f}); q handed to the verifier must be the law the "
            f"drafts were actually drawn from: the draft's q for sampled drafts, None (one-hot) for argmax drafts")


def check_acceptance(draft_fn, N=4000):
    """At one context with k = 1, acceptance is p(argmax q) (greedy) or sum min(p, q) (probabilistic)."""
    target, dm, g = pair(2)
    p0, q0 = target([1]), dm([1])
    theory = {"greedy": float(p0[q0.argmax()]), "probabilistic": float(torch.minimum(p0, q0).sum())}
    for method, want in theory.items():
        accepted = 0
        for _ in range(N):
            drafts, q = draft_fn(dm, [1], 1, method, generator=g)
            p = torch.stack([target([1]), target([1] + drafts)])
            accepted += len(verify_step(drafts, p, q, generator=g)) == 2
        rate, sd = accepted / N, math.sqrt(want * (1 - want) / N)
        if abs(rate - want) > 5 * sd:
            return (f"{method} drafting: acceptance {rate:.3f}, but theory says {want:.3f} "
                    f"(greedy: p(argmax q) = {theory['greedy']:.3f}; probabilistic: sum min(p, q) = "
                    f"{theory['probabilistic']:.3f}). Sampled drafts verified as one-hot (q = None) are still exact "
                    f"but accepted only with probability p(x): keep q to get sum min(p, q)")
    return None


def test_draft_shapes(impl):
    fail_on(check_shapes(impl.draft))


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_drafting_is_exact(impl, method):
    fail_on(check_law(impl.draft, method))


def test_acceptance_of_each_method(impl):
    fail_on(check_acceptance(impl.draft))


# ---------------------------------------------------------------------------------------------
# Counters


def check_by_hand(observe):
    c = new_counters(4)
    for drafted, accepted in [(4, 2), (4, 4), (0, 0), (3, 0), (1, 1)]:
        observe(c, drafted, accepted)
    want = {"num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 7,
            "num_accepted_tokens_per_pos": [3, 2, 1, 1], "num_draft_tokens_per_pos": [4, 3, 3, 2],
            "num_positions_tested": 3 + 4 + 1 + 1}
    why = {"num_drafts": "a step with 0 drafts is not a draft",
           "num_accepted_tokens_per_pos": "position i counts the steps that accepted their draft i",
           "num_draft_tokens_per_pos": "position i counts the steps whose draft reached length i + 1",
           "num_positions_tested": "a step accepting a of k drafts tested min(a + 1, k) positions"}
    for key, value in want.items():
        if c.get(key) != value:
            return (f"after observing (drafted, accepted) = (4, 2), (4, 4), (0, 0), (3, 0), (1, 1): {key} should be "
                    f"{value}, got {c.get(key)}" + (f" ({why[key]})" if key in why else ""))
    return None


def check_rates(acceptance_rate, mean_acceptance_length, acceptance_per_pos, alpha):
    c = {"num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 7,
         "num_accepted_tokens_per_pos": [3, 2, 1, 1], "num_draft_tokens_per_pos": [4, 3, 3, 2],
         "num_positions_tested": 9}
    checks = [("acceptance_rate", acceptance_rate(c), 7 / 12, "accepted / drafted"),
              ("mean_acceptance_length", mean_acceptance_length(c), 1 + 7 / 4,
               "1 + accepted / drafts: the recovered or bonus token counts"),
              ("alpha", alpha(c), 7 / 9, "accepted / positions tested")]
    for name, got, want, why in checks:
        if got != pytest.approx(want):
            return f"{name} should be {want:.4f} ({why}), got {got}"
    got = acceptance_per_pos(c)
    want = [3 / 4, 2 / 3, 1 / 3, 1 / 2]
    if got != pytest.approx(want):
        return (f"acceptance_per_pos should be accepted_per_pos / draft_tokens_per_pos = {[round(w, 3) for w in want]}, "
                f"got {got}; dividing by num_drafts (old vLLM) under-reports later positions when drafts are short")
    return None


def test_observe_by_hand(impl):
    fail_on(check_by_hand(impl.observe))


def test_rates_by_hand(impl):
    fail_on(check_rates(impl.acceptance_rate, impl.mean_acceptance_length, impl.acceptance_per_pos, impl.alpha))


def test_empty_counters(impl):
    c = new_counters(3)
    assert impl.acceptance_rate(c) == 0.0 and impl.alpha(c) == 0.0, "no drafts yet: rates are 0.0, not a ZeroDivisionError"
    assert impl.mean_acceptance_length(c) == 1.0, "no drafts: each step emitted exactly 1 token"
    assert impl.acceptance_per_pos(c) == [0.0, 0.0, 0.0], "no drafts reached any position: 0.0 each"


@pytest.mark.parametrize("seed", range(10))
def test_matches_speclab_on_random_steps(impl, seed):
    rng = random.Random(seed)
    k = rng.randint(1, 8)
    c, ref = new_counters(k), SpecDecodingStats(k)
    for _ in range(rng.randint(1, 200)):
        drafted = rng.choice([k, rng.randint(0, k)])
        accepted = min(drafted, int(rng.expovariate(0.5)))
        impl.observe(c, drafted, accepted)
        ref.observe(drafted, accepted)
    for key, value in ref.as_dict().items():
        if key in c and c[key] != value:
            pytest.fail(f"seed {seed}: {key} = {c[key]} but speclab's SpecDecodingStats counts {value}", pytrace=False)
    assert impl.mean_acceptance_length(c) == pytest.approx(ref.mean_acceptance_length)
    assert impl.alpha(c) == pytest.approx(ref.alpha)


# ---------------------------------------------------------------------------------------------
# Negative controls


def greedy_keeps_q(draft_model, tokens, k, sample_method="greedy", generator=None):
    """BUG: argmax drafts, but the draft's soft q handed to the verifier."""
    from solutions.ex04_acceptance_metrics import draft
    drafts, _ = draft(draft_model, tokens, k, sample_method, generator)
    q = torch.stack([draft_model(list(tokens) + drafts[:i]) for i in range(k)])
    return drafts, q


def probabilistic_drops_q(draft_model, tokens, k, sample_method="greedy", generator=None):
    """BUG (acceptance only): sampled drafts verified as one-hot."""
    from solutions.ex04_acceptance_metrics import draft
    return draft(draft_model, tokens, k, sample_method, generator)[0], None


def observe_counts_drafted_as_accepted_per_pos(counters, num_draft_tokens, num_accepted):
    """BUG: per-position counters confused (accepted counted at every drafted position)."""
    from solutions.ex04_acceptance_metrics import observe
    observe(counters, num_draft_tokens, num_draft_tokens)
    counters["num_accepted_tokens"] += num_accepted - num_draft_tokens


def observe_counts_empty_steps(counters, num_draft_tokens, num_accepted):
    """BUG: a step without drafts counted as a draft."""
    from solutions.ex04_acceptance_metrics import observe
    counters["num_drafts"] += num_draft_tokens == 0
    observe(counters, num_draft_tokens, num_accepted)


def per_pos_over_num_drafts(counters):
    """BUG: vLLM's older per-position rate, accepted_per_pos / num_drafts."""
    return [a / counters["num_drafts"] for a in counters["num_accepted_tokens_per_pos"]]


def test_control_law_check_catches_greedy_with_soft_q(controls):
    message = check_law(greedy_keeps_q, "greedy")
    assert message is not None
    print(message)


def test_control_acceptance_check_catches_dropped_q(controls):
    assert check_law(probabilistic_drops_q, "probabilistic") is None, "dropping q is exact: the law check cannot see it"
    message = check_acceptance(probabilistic_drops_q)
    assert message is not None
    print(message)


def test_control_shape_check_catches(controls):
    assert check_shapes(greedy_keeps_q) is not None and check_shapes(probabilistic_drops_q) is not None


@pytest.mark.parametrize("fn", [observe_counts_drafted_as_accepted_per_pos, observe_counts_empty_steps],
                         ids=lambda f: f.__name__)
def test_control_counter_check_catches(controls, fn):
    message = check_by_hand(fn)
    assert message is not None
    print(message)


def test_control_rate_check_catches_old_per_pos(controls):
    from solutions.ex04_acceptance_metrics import acceptance_rate, alpha, mean_acceptance_length
    message = check_rates(acceptance_rate, mean_acceptance_length, per_pos_over_num_drafts, alpha)
    assert message is not None
    print(message)
