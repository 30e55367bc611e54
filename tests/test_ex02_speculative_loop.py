"""Grades exercise 02 (per-position theory, an early-stopping loop step).
`pytest --impl=exercises tests/test_ex02_speculative_loop.py`. Negative controls at the bottom
grade the grader (skipped under --impl=exercises)."""

import numpy as np
import pytest
import torch

from speclab import stats
from speclab.toy import MarkovLM
from speclab.verify import verify_step

EXERCISE = "ex02_speculative_loop"
pytestmark = pytest.mark.exercise


def test_expected_tokens_per_position(impl):
    cases = [([], 1.0), ([0.5], 1.5), ([0.5, 0.5], 1.75), ([0.9, 0.5, 1.0], 1 + 0.9 + 0.45 + 0.45), ([0.0, 1.0], 1.0)]
    for alphas, want in cases:
        got = impl.expected_tokens_per_position(alphas)
        if got != pytest.approx(want):
            pytest.fail(f"alphas {alphas}: position i is reached only if 0..i-1 were accepted, so a step emits "
                        f"1 + a1 + a1*a2 + ... = {want:.3f} tokens on average (the 1 is the recovered or bonus "
                        f"token); got {got}", pytrace=False)
    for alpha in (0.3, 0.8):
        assert impl.expected_tokens_per_position([alpha] * 6) == pytest.approx(stats.expected_tokens(alpha, 6)), \
            "with a flat alpha this must equal lesson 02's (1 - alpha^(gamma+1)) / (1 - alpha)"


def test_speedup(impl):
    got = impl.speedup([0.8] * 8, 0.05)
    if got != pytest.approx(3.09, abs=0.01):
        pytest.fail(f"alpha 0.8 at every position, gamma 8, c 0.05: a step costs gamma*c + 1 = 1.4 target forwards "
                    f"and yields 4.33 tokens, so the speedup is 3.09; got {got}", pytrace=False)
    assert impl.speedup([], 0.5) == 1.0, "gamma = 0 is plain decoding: speedup 1"


def test_best_gamma(impl):
    for alphas, c in [([0.9, 0.9, 0.9, 0.9], 0.05), ([0.9, 0.2, 0.95, 0.95], 0.1), ([0.3, 0.3], 0.5),
                      ([0.6, 0.9, 0.95, 0.97, 0.98, 0.99], 0.2)]:
        want = max(range(len(alphas) + 1), key=lambda g: (stats.expected_tokens_per_position(alphas[:g]) / (g * c + 1), -g))
        got = impl.best_gamma(alphas, c)
        if got != want:
            pytest.fail(f"alphas {alphas}, c = {c}: the best gamma is {want} (try every prefix: a low alpha early "
                        f"does not mean later positions are bad, and gamma is capped at len(alphas)); got {got}",
                        pytrace=False)


def two_token_law(step, gamma, min_draft_prob, N=8000, seed=4):
    """Counts of the first two generated tokens, steps repeated from prefix [0] until two exist."""
    g = torch.Generator().manual_seed(seed)
    V = 4
    target = MarkovLM.random(V, g, spread=1.5)
    draft = target.blend(MarkovLM.random(V, g, spread=3.0), 0.6)
    counts = np.zeros((V, V))
    for _ in range(N):
        out = []
        while len(out) < 2:
            out += step(target, draft, [0] + out, gamma, min_draft_prob, generator=g)
        counts[out[0], out[1]] += 1
    return counts, target.joint([0], 2).numpy()


def check_law(step, gamma=2, min_draft_prob=0.5):
    """None when the first two tokens follow the target's joint law; otherwise a message that says which
    part is wrong: the law is checked again without the early stop (min_draft_prob = 0) to tell a wrong
    stopping rule from a wrong verification."""
    counts, exact = two_token_law(step, gamma, min_draft_prob)
    pv = stats.chi2_gof(counts.ravel(), exact.ravel())
    if pv > 1e-4:
        return None
    tv = stats.tv_distance(counts / counts.sum(), exact)
    first_tv = stats.tv_distance(counts.sum(1) / counts.sum(), exact.sum(1))
    where = (f"chi2 p={pv:.1e}, TV={tv:.3f} over the 16 pairs, TV={first_tv:.3f} on the first token alone")
    counts0, _ = two_token_law(step, gamma, 0.0)
    if stats.chi2_gof(counts0.ravel(), exact.ravel()) <= 1e-4:
        return (f"the first two tokens do not follow the target's joint law ({where}), even with min_draft_prob = 0 "
                f"(no early stop), so the verification is wrong: p row i must be target(tokens + drafts[:i]) "
                f"(len(drafts) + 1 rows, the last one the bonus row), q row i the distribution x_i was drawn "
                f"from, and the tokens returned are the accepted drafts then one recovered or bonus token")
    return (f"the first two tokens do not follow the target's joint law ({where}), but they do with "
            f"min_draft_prob = 0, so the early stop is wrong: the decision to stop drafting must depend only "
            f"on q_i, taken before x_i is drawn; a draft kept or dropped after looking at x_i is no longer a "
            f"sample from q_i, and verification with q_i is then wrong")


class Recorder:
    """A model that records the contexts it is called on."""

    def __init__(self, lm):
        self.lm, self.calls = lm, []

    def __call__(self, toks):
        self.calls.append(list(toks))
        return self.lm(toks)


def check_calls(step):
    """A draft that is sure after token 1 and unsure after token 2: drafting must stop there."""
    p_sure, p_unsure = [0.0, 0.0, 1.0, 0.0], [0.3, 0.3, 0.2, 0.2]
    table = torch.tensor([p_unsure, [0.0, 0.0, 1.0, 0.0], p_unsure, p_unsure], dtype=torch.float64)
    draft = Recorder(MarkovLM(table))
    target = Recorder(MarkovLM(table))  # the target agrees, so every draft is accepted
    out = step(target, draft, [3, 1], 4, 0.5, generator=torch.Generator().manual_seed(5))
    if len(draft.calls) != 2:
        return (f"draft called {len(draft.calls)} times on {draft.calls}: after [3, 1] the draft is sure (max q = 1) "
                f"and drafts 2; after [3, 1, 2] its max q is 0.3 < min_draft_prob 0.5, so drafting stops there "
                f"(2 draft calls, 1 draft)")
    if len(target.calls) != 2:
        return (f"target scored {len(target.calls)} contexts {target.calls}: with 1 draft it needs 1 + 1 rows "
                f"(the draft's row and the bonus row), not gamma + 1")
    if out[0] != 2 or len(out) != 2:
        return f"q == p here, so the one draft (2) is accepted and a bonus follows: want [2, <bonus>], got {out}"
    if out[1] not in (0, 1, 2, 3):
        return f"the bonus must be a token id, got {out[1]}"
    return None


def test_step_stops_drafting_when_unsure(impl):
    message = check_calls(impl.speculative_step)
    if message:
        pytest.fail(message, pytrace=False)


def test_step_without_threshold_drafts_gamma(impl):
    g = torch.Generator().manual_seed(6)
    lm = MarkovLM.random(5, g)
    draft, target = Recorder(lm), Recorder(lm)
    out = impl.speculative_step(target, draft, [1, 2], 3, generator=g)
    assert len(draft.calls) == 3 and draft.calls[0] == [1, 2] and len(draft.calls[2]) == 4, \
        f"min_draft_prob = 0 never stops: 3 draft calls, each on the context plus the drafts so far; got {draft.calls}"
    assert len(out) == 4 and out[:3] == draft.calls[2][2:] + [out[2]], \
        f"the draft is the target (p == q): all 3 drafts accepted, then a bonus; got {out}"
    out = impl.speculative_step(target, draft, [1], 3, min_draft_prob=1.5, generator=g)
    assert len(out) == 1, f"min_draft_prob > 1 stops before the first draft: plain decoding, one token; got {out}"


def test_step_preserves_the_target_distribution(impl):
    """Joint law of two tokens (16 cells), chi-squared p < 1e-4 fails; detects TV >= ~0.04."""
    message = check_law(impl.speculative_step)
    if message:
        pytest.fail(message, pytrace=False)


# ---------------------------------------------------------------------------------------------
# Negative controls


def drops_unlikely_drafts(target, draft, tokens, gamma, min_draft_prob=0.0, generator=None):
    """BUG: draws x_i first, then stops if q_i(x_i) < min_draft_prob (the choice looks at x_i)."""
    ctx, drafts, q = list(tokens), [], []
    for _ in range(gamma):
        q_i = draft(ctx)
        x = int(torch.multinomial(q_i, 1, generator=generator))
        if float(q_i[x]) < min_draft_prob:
            break
        drafts.append(x); q.append(q_i); ctx.append(x)
    p = torch.stack([target(list(tokens) + drafts[:i]) for i in range(len(drafts) + 1)])
    return verify_step(drafts, p, torch.stack(q) if q else None, generator=generator)


def lesson_step(target, draft, tokens, gamma, min_draft_prob=0.0, generator=None):
    """BUG (incomplete): lesson 02's step, which ignores min_draft_prob."""
    from solutions.ex02_speculative_loop import speculative_step
    return speculative_step(target, draft, tokens, gamma, 0.0, generator=generator)


def scores_gamma_rows(target, draft, tokens, gamma, min_draft_prob=0.0, generator=None):
    """BUG (waste): stops drafting but still asks the target for gamma + 1 rows."""
    from solutions.ex02_speculative_loop import speculative_step
    for i in range(gamma + 1):
        target(list(tokens) + [0] * i)
    return speculative_step(lambda t: target.lm(t) if isinstance(target, Recorder) else target(t),
                            draft, tokens, gamma, min_draft_prob, generator=generator)


def p_rows_one_ahead(target, draft, tokens, gamma, min_draft_prob=0.0, generator=None):
    """BUG: p row i scored on tokens + drafts[:i + 1] (each draft checked against the row after it)."""
    ctx, drafts, q = list(tokens), [], []
    for _ in range(gamma):
        q_i = draft(ctx)
        if float(q_i.max()) < min_draft_prob:
            break
        drafts.append(int(torch.multinomial(q_i, 1, generator=generator)))
        q.append(q_i)
        ctx.append(drafts[-1])
    rows = [target(list(tokens) + drafts[:i + 1]) for i in range(len(drafts))] + [target(list(tokens) + drafts)]
    return verify_step(drafts, torch.stack(rows), torch.stack(q) if q else None, generator=generator)


def test_control_law_check_catches_a_step_that_looks_at_the_draft(controls):
    message = check_law(drops_unlikely_drafts)
    assert message is not None and "the early stop is wrong" in message, message
    print(message)


@pytest.mark.slow
def test_control_law_check_names_a_wrong_verification(controls):
    message = check_law(p_rows_one_ahead)
    assert message is not None and "so the verification is wrong" in message, message
    print(message)


@pytest.mark.parametrize("fn", [lesson_step, scores_gamma_rows], ids=lambda f: f.__name__)
def test_control_call_check_catches(controls, fn):
    message = check_calls(fn)
    assert message is not None, f"the call check passed {fn.__name__}"
    print(message)
