"""Grades exercise 01 (batched verification). `pytest --impl=exercises tests/test_ex01_rejection_sampling.py`.

Every check is a function that returns None or one sentence naming what went wrong; the tests fail
with that sentence, and the negative controls at the bottom prove that each check fails plausible
wrong verifiers (they grade the grader, so they are skipped under --impl=exercises).
"""

import numpy as np
import pytest
import torch

import mutants
from helpers import fail_on, random_rows
from speclab import stats
from speclab.verify import verify_greedy_step, verify_step

EXERCISE = "ex01_rejection_sampling"
pytestmark = pytest.mark.exercise


def batch(seed, N, k, V, spread=1.5):
    """N sequences sharing nothing: p (N, k + 1, V), q (N, k, V) near p, drafts x ~ q, uniforms."""
    g = torch.Generator().manual_seed(seed)
    p = random_rows(N * (k + 1), V, g, spread).reshape(N, k + 1, V)
    q = (0.5 * p[:, :k] + 0.5 * random_rows(N * k, V, g, spread).reshape(N, k, V))
    x = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(N, k) if k else torch.empty(N, 0, dtype=torch.long)
    u = torch.rand(N, k, dtype=torch.float64, generator=g).clamp(min=1e-12)
    return x, p, q, u, g


def emitted(out, r):
    row = out[r].tolist()
    return row[:row.index(-1)] if -1 in row else row


def check_shape(verify_batch):
    x, p, q, u, g = batch(10, 32, 4, 7)
    out = verify_batch(x, p, q, u, generator=g)
    if not torch.is_tensor(out) or out.shape != (32, 5) or out.dtype != torch.int64:
        got = tuple(out.shape) if torch.is_tensor(out) else type(out).__name__
        return f"verify_batch must return an (N, k + 1) = (32, 5) int64 tensor, got {got}"
    for r in range(32):
        row = out[r].tolist()
        n_end = row.index(-1) if -1 in row else 5
        if n_end == 0 or any(t != -1 for t in row[n_end:]):
            return (f"row {r} is {row}: each row holds 1..k+1 tokens (accepted drafts, then exactly one "
                    f"recovered or bonus token) and then only -1 padding")
    return None


def check_accepts_like_verify_step(verify_batch, k=4, seed=11):
    """With the same uniforms, the accepted prefix of every row is fixed: compare with speclab."""
    x, p, q, u, g = batch(seed, 200, k, 7)
    out = verify_batch(x, p, q, u, generator=g)
    for r in range(200):
        ref = verify_step(x[r].tolist(), p[r], q[r], uniforms=u[r], generator=g)
        mine = emitted(out, r)
        if mine[:-1] != ref[:-1]:
            i = next((j for j in range(min(len(mine), len(ref)) - 1) if mine[j] != ref[j]), min(len(mine), len(ref)) - 1)
            t = int(x[r, i])
            ratio = float(p[r, i, t] / q[r, i, t])
            verdict = "accepted" if u[r, i] <= min(1, ratio) else "rejected"
            return (f"row {r}, draft position {i}: x = {t}, p(x)/q(x) = {ratio:.3f}, u = {float(u[r, i]):.3f}, "
                    f"so the draft is {verdict} (accept iff u <= min(1, p/q)) and verification stops at the "
                    f"first rejection; you emitted {mine}, speclab accepts {ref[:-1]} then one token")
    return None


def check_target_distribution(verify_batch, N=12_000, k=3, V=6, seed=1):
    """Every emitted position follows p (chi-squared per position; p < 1e-4 fails)."""
    g = torch.Generator().manual_seed(seed)
    p1 = random_rows(k + 1, V, g)
    q1 = 0.5 * p1[:k] + 0.5 * random_rows(k, V, g)
    p, q = p1.expand(N, k + 1, V), q1.expand(N, k, V)
    x = torch.multinomial(q1, N, replacement=True, generator=g).T.contiguous()  # (N, k)
    u = torch.rand(N, k, dtype=torch.float64, generator=g).clamp(min=1e-12)
    out = verify_batch(x, p, q, u, generator=g)
    counts = np.zeros((k + 1, V), dtype=np.int64)
    for j in range(k + 1):
        col = out[:, j]
        counts[j] = torch.bincount(col[col >= 0], minlength=V).numpy()[:V]
    if counts[k].sum() == 0:
        return "the bonus position was never reached: when all k drafts are accepted, add a token sampled from p[k]"
    pvals = [stats.chi2_gof(counts[j], p1[j].numpy()) if counts[j].sum() else 1.0 for j in range(k + 1)]
    total = stats.chi2_gof_strata(list(counts), list(p1.numpy()))
    if total > 1e-4 and min(pvals) > 1e-4 / (k + 1):
        return None
    lines = []
    for j in range(k + 1):
        name = f"bonus (p[{k}])" if j == k else f"draft position {j}"
        n = counts[j].sum()
        tv = stats.tv_distance(counts[j] / max(n, 1), p1[j])
        flag = "  <-- not the target's distribution" if pvals[j] <= 1e-4 / (k + 1) else ""
        lines.append(f"  {name:<16} n={n:6d}  chi2 p={pvals[j]:9.2e}  TV={tv:.3f} "
                     f"(detectable {stats.min_detectable_tv(max(n, 1), V):.3f}){flag}")
    worst = int(np.argmin(pvals))
    hint = ("the bonus token must be *sampled* from the target's last row p[k]" if worst == k else
            "a rejected draft must be replaced by a draw from norm(max(p - q, 0)) at that position, "
            "and each position needs its own uniform")
    return (f"the tokens you emit are not distributed as the target (all positions: chi2 p={total:.1e}); "
            f"worst at {'the bonus position' if worst == k else f'draft position {worst}'}: {hint}.\n"
            + "\n".join(lines))


def test_acceptance_probability(impl):
    p_x = torch.tensor([[0.2, 0.6, 0.0], [0.5, 0.1, 0.3]], dtype=torch.float64)
    q_x = torch.tensor([[0.4, 0.3, 0.3], [0.0, 0.1, 0.6]], dtype=torch.float64)
    got = impl.acceptance_probability(p_x, q_x)
    want = torch.tensor([[0.5, 1.0, 0.0], [0.0, 1.0, 0.5]], dtype=torch.float64)
    assert torch.is_tensor(got) and got.shape == (2, 3), \
        f"acceptance_probability works elementwise on tensors and keeps their shape (2, 3); got {got!r}"
    for idx in zip(*torch.nonzero(~torch.isclose(got, want), as_tuple=True)):
        i, j = int(idx[0]), int(idx[1])
        pytest.fail(f"p(x) = {p_x[i, j]:.1f}, q(x) = {q_x[i, j]:.1f}: acceptance is min(1, p/q), and 0 when "
                    f"q(x) = 0 (the draft could not have proposed x); want {want[i, j]:.2f}, got {float(got[i, j]):.2f}",
                    pytrace=False)


def test_residual_distribution(impl):
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.5, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.4, 0.0, 0.4], [0.25, 0.25, 0.5, 0.0]], dtype=torch.float64)
    got = impl.residual_distribution(p, q)
    want = torch.tensor([[0.6, 0.0, 0.4, 0.0], [0.25, 0.25, 0.5, 0.0]], dtype=torch.float64)
    assert got.shape == p.shape, f"residual_distribution keeps the shape (..., V) = {tuple(p.shape)}, got {tuple(got.shape)}"
    if not torch.allclose(got[0], want[0]):
        pytest.fail(f"row 0: max(p - q, 0) = [0.3, 0, 0.2, 0], normalised to {want[0].tolist()}; got "
                    f"{got[0].tolist()} (normalise each row by its own sum, over the last dimension)", pytrace=False)
    if not torch.allclose(got[1], want[1]):
        pytest.fail(f"row 1 has p == q, so max(p - q, 0) is all zero: fall back to p = {want[1].tolist()} instead "
                    f"of dividing by 0; got {got[1].tolist()}", pytrace=False)
    three_d = impl.residual_distribution(p[None].expand(3, 2, 4), q[None].expand(3, 2, 4))
    assert torch.allclose(three_d, want.expand(3, 2, 4)), "residual_distribution must work on any leading shape (..., V)"


def test_verify_batch_shape_and_padding(impl):
    fail_on(check_shape(impl.verify_batch))


def test_verify_batch_accepts_like_verify_step(impl):
    fail_on(check_accepts_like_verify_step(impl.verify_batch))


def test_verify_batch_k_zero_and_k_one(impl):
    fail_on(check_accepts_like_verify_step(impl.verify_batch, k=1, seed=12))
    x, p, q, u, g = batch(13, 16, 0, 5)
    out = impl.verify_batch(x, p, q, u, generator=g)
    assert out.shape == (16, 1) and bool((out >= 0).all()), \
        f"with k = 0 drafts each row is just one token sampled from p[0] (the bonus of an empty draft); got {out.tolist()}"


def test_verify_batch_emits_the_target_distribution(impl):
    """Per position chi-squared, p < 1e-4 fails (Bonferroni over positions); detects TV >= ~0.04 at position 0."""
    fail_on(check_target_distribution(impl.verify_batch))


def test_verify_batch_samples_the_bonus_token(impl):
    """With q == p every draft is accepted, and the bonus column must follow p[k], not its argmax."""
    g = torch.Generator().manual_seed(2)
    N, V = 4000, 3
    p1 = torch.tensor([[0.2, 0.3, 0.5], [0.3, 0.3, 0.4]], dtype=torch.float64)
    p, q = p1.expand(N, 2, V), p1[:1].expand(N, 1, V)
    x = torch.multinomial(p1[0], N, replacement=True, generator=g)[:, None]
    out = impl.verify_batch(x, p, q, torch.rand(N, 1, dtype=torch.float64, generator=g).clamp(min=1e-12), generator=g)
    if not bool((out[:, 0] == x[:, 0]).all()):
        pytest.fail("with q == p, p(x)/q(x) = 1 >= u: every draft must be accepted", pytrace=False)
    freq = torch.bincount(out[:, 1], minlength=V).double() / N
    if stats.chi2_gof(torch.bincount(out[:, 1], minlength=V).numpy(), p1[1].numpy()) < 1e-4:
        pytest.fail(f"bonus position: frequencies {freq.numpy().round(3).tolist()} but p[k] = {p1[1].tolist()}: "
                    f"the bonus token is a *sample* from the target's last row (argmax would make it deterministic)",
                    pytrace=False)


def test_verify_greedy_batch(impl):
    g = torch.Generator().manual_seed(3)
    for k in (0, 1, 4):
        N, V = 64, 5
        p = random_rows(N * (k + 1), V, g).reshape(N, k + 1, V)
        x = torch.randint(0, V, (N, k), generator=g)
        x[:, : k // 2 + 1] = p[:, : k // 2 + 1].argmax(-1)[:, :k][:, : k // 2 + 1]  # long right runs
        out = impl.verify_greedy_batch(x, p)
        assert out.shape == (N, k + 1), f"verify_greedy_batch returns (N, k + 1) = ({N}, {k + 1}), got {tuple(out.shape)}"
        for r in range(N):
            ref = verify_greedy_step(x[r].tolist(), p[r])
            if emitted(out, r) != ref or out[r].tolist()[len(ref):] != [-1] * (k + 1 - len(ref)):
                pytest.fail(f"k={k}, row {r}: drafts {x[r].tolist()}, target argmax per row {p[r].argmax(-1).tolist()}: "
                            f"keep drafts while they equal the argmax, then add the argmax of the row where you "
                            f"stopped, then -1; want {ref} + padding, got {out[r].tolist()}", pytrace=False)


# ---------------------------------------------------------------------------------------------
# Negative controls: plausible wrong verifiers that the checks above must catch.


def rowwise(mutant):
    """A tests/mutants.py verifier (one sequence) run row by row, padded like verify_batch."""
    def verify_batch(draft_tokens, p, q, uniforms, generator=None):
        k = draft_tokens.shape[1]
        rows = [mutant(draft_tokens[r].tolist(), p[r], q[r], uniforms=uniforms[r], generator=generator)
                for r in range(draft_tokens.shape[0])]
        return torch.tensor([row + [-1] * (k + 1 - len(row)) for row in rows])
    return verify_batch


def keeps_going_after_a_rejection(draft_tokens, p, q, uniforms, generator=None):
    """BUG: counts every accepted draft (sum) instead of the run before the first rejection (cumprod)."""
    N, k = draft_tokens.shape
    out = torch.full((N, k + 1), -1)
    for r in range(N):
        row = verify_step(draft_tokens[r].tolist(), p[r], q[r], uniforms=uniforms[r], generator=generator)
        kept = [int(t) for i, t in enumerate(draft_tokens[r]) if uniforms[r, i] <= min(1, float(p[r, i, t] / q[r, i, t]))]
        row = kept + row[-1:]
        out[r, :len(row)] = torch.tensor(row)
    return out


def bonus_from_q(draft_tokens, p, q, uniforms, generator=None):
    """BUG: when every draft is accepted, the extra token is drawn from the draft's last row."""
    N, k = draft_tokens.shape
    out = torch.full((N, k + 1), -1)
    for r in range(N):
        row = verify_step(draft_tokens[r].tolist(), p[r], q[r], uniforms=uniforms[r], generator=generator)
        if len(row) == k + 1:
            row[-1] = int(torch.multinomial(q[r, k - 1], 1, generator=generator))
        out[r, :len(row)] = torch.tensor(row)
    return out


DISTRIBUTION_MUTANTS = {**{name: rowwise(fn) for name, fn in mutants.MUTANTS.items() if name != "accept_if_p_ge_q"},
                        "bonus_from_q": bonus_from_q}


@pytest.mark.parametrize("name", sorted(DISTRIBUTION_MUTANTS))
def test_control_distribution_check_catches(controls, name):
    message = check_target_distribution(DISTRIBUTION_MUTANTS[name])
    assert message is not None, f"the distribution check passed the broken verifier {name!r}: it has no power"
    print(f"{name}: {message}")


@pytest.mark.parametrize("name, fn", [("accept_if_p_ge_q", rowwise(mutants.accept_if_p_ge_q)),
                                      ("keeps_going_after_a_rejection", keeps_going_after_a_rejection)])
def test_control_accept_check_catches(controls, name, fn):
    message = check_accepts_like_verify_step(fn)
    assert message is not None, f"the accept check passed the broken verifier {name!r}"
    print(f"{name}: {message}")


def test_control_solution_passes_every_check(controls):
    from solutions.ex01_rejection_sampling import verify_batch
    assert check_shape(verify_batch) is None
    assert check_accepts_like_verify_step(verify_batch) is None
    assert check_target_distribution(verify_batch) is None
