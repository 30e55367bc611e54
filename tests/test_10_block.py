"""Lesson 10: block verification (Sun et al., ICLR 2025) is exact, and keeps at least as many drafts.

Block verification is exact over the whole loop, not position by position within one step, so
its law is tested as lesson 02 tests the loop: many independent sequences of toy Markov models
(speclab.toy), drafted and verified step after step, their first L tokens counted over all V^L
sequences and compared with the exact joint law by a chi-squared test (p < 1e-4 fails; each test
states the smallest TV distance it detects with power 0.99). Mutants, deliberately broken block
verifiers, must fail the same test: the token-wise residual max(p - q, 0) where the block residual
max(rho p - q, 0) belongs, and stopping at the first failed test instead of keeping the last one
that passed. Besides the law: a plain-Python transcription of the paper's algorithm, the exact
expected accepted drafts against the token-wise rule's, greedy == greedy, and the edge cases.
"""

from dataclasses import fields

import numpy as np
import pytest
import torch

from helpers import random_rows, run_engine
from speclab import stats
from speclab.engine.config import EngineConfig
from speclab.engine.llm_engine import LLMEngine
from speclab.models.llama import load_llama
from speclab.proposers.draft_model import DraftModelProposer
from speclab.sampling import logits_to_probs
from speclab.sampling_params import SamplingParams
from speclab.toy import MarkovLM
from speclab.verify import RULES, block, get_rule
from speclab.verify import rejection_sample as rejection_sample_by_name
from speclab.verify.rejection import rejection_sample as token_wise

SIGNIFICANCE = 1e-4
V, L, N = 3, 4, 40_000  # 81 sequences of 4 tokens: detects TV >= ~0.04 over the joint law


# ----------------------------------------------------------------------------------------------
# The loop: N sequences at once, every step one call of a rule on an N-request ragged batch


def toy_pair(seed, target_spread=1.5, draft_spread=2.0, weight=1.0):
    g = torch.Generator().manual_seed(seed)
    target = MarkovLM.random(V, g, spread=target_spread)
    draft = target.blend(MarkovLM.random(V, g, spread=draft_spread), weight)
    return target, draft, g


def loop_counts(rule, target, draft, gamma, g, *, start=0, n=N, one_hot=False):
    """(V^L,) counts of the first L tokens of n speculative loops (drafts from `draft`, or its argmax)."""
    seq = torch.full((n, L + gamma + 1), -1, dtype=torch.long)
    length = torch.zeros(n, dtype=torch.long)
    last = torch.full((n,), start, dtype=torch.long)
    while bool((length < L).any()):
        act = (length < L).nonzero().flatten()
        ctx, q = [last[act]], []
        for _ in range(gamma):
            q_i = draft.transition[ctx[-1]]  # (m, V)
            q.append(q_i)
            ctx.append(q_i.argmax(-1) if one_hot else torch.multinomial(q_i, 1, generator=g).flatten())
        m = act.numel()
        drafts = torch.stack(ctx[1:], 1).reshape(-1) if gamma else torch.empty(0, dtype=torch.long)
        p = target.transition[torch.stack(ctx, 1)].reshape(m * (gamma + 1), V)  # (m * (gamma + 1), V)
        q = None if one_hot else (torch.stack(q, 1).reshape(m * gamma, V) if gamma else torch.empty(0, V))
        out = rule(drafts, [gamma] * m, p.float(), None if q is None else q.float(), generator=g)
        emitted = (out >= 0).sum(1)
        for j in range(gamma + 1):
            rows = act[j < emitted]
            seq[rows, length[rows] + j] = out[j < emitted, j]
        length[act] += emitted
        last[act] = out[torch.arange(m), emitted - 1]
    idx = (seq[:, :L] * V ** torch.arange(L - 1, -1, -1)).sum(1)
    return np.bincount(idx.numpy(), minlength=V ** L)


def joint_pvalue(counts, target, start=0):
    return stats.chi2_gof(counts, target.joint([start], L).ravel().numpy())


def detects():
    return stats.min_detectable_tv(N, V ** L, SIGNIFICANCE)


# ----------------------------------------------------------------------------------------------
# Mutants: block verification with one classic bug each (patched into speclab.verify.block)


@pytest.fixture
def mutate(monkeypatch):
    """Turn speclab.verify.block into a broken variant by name (undone after the test)."""
    def apply(name):
        if name == "token_wise_residual":  # emit from max(p - q, 0): ignores the block's rho_tau
            end = block._end_tokens
            monkeypatch.setattr(block, "_end_tokens", lambda tp, dp, d, cu, n, k, rho, greedy, noise:
                                end(tp, dp, d, cu, n, k, torch.ones_like(rho), greedy, noise))
        elif name == "token_wise_residual_everywhere":  # rho dropped from the residual mass Z too
            residual = block.block_residual
            monkeypatch.setattr(block, "block_residual", lambda rho, p, q: residual(torch.ones_like(rho), p, q))
        elif name == "stop_at_first_failure":  # tau = the run of passed tests, as token-wise
            monkeypatch.setattr(block, "last_passing", lambda passed: passed.long().cumprod(1).sum(1))
        else:
            raise KeyError(name)
        return block.rejection_sample
    return apply


MUTANTS = ("token_wise_residual", "token_wise_residual_everywhere", "stop_at_first_failure")
MUTANT_CASE = dict(seed=3, target_spread=1.0, draft_spread=3.0)  # an unrelated, peaked draft
MUTANT_GAMMA = 6  # long blocks: tau < gamma with rho_tau < 1 is frequent


# ----------------------------------------------------------------------------------------------
# The law of the loop


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [1, 2, 4, 6])
@pytest.mark.parametrize("weight", [0.6, 1.0], ids=["close_draft", "unrelated_draft"])
def test_loop_law_matches_target(gamma, weight):
    target, draft, g = toy_pair(seed=10 * gamma + int(10 * weight), weight=weight)
    pv = joint_pvalue(loop_counts(block.rejection_sample, target, draft, gamma, g), target)
    assert pv > SIGNIFICANCE, f"gamma={gamma}: block verification's loop law differs from the target " \
                              f"(p={pv:.2e}; this test detects TV >= {detects():.3f})"


@pytest.mark.slow
def test_loop_law_with_one_hot_drafts_and_a_blind_draft():
    """draft_probs=None (argmax drafts), and a draft with zeros where the target has mass."""
    g = torch.Generator().manual_seed(5)
    target = MarkovLM.random(V, g, spread=1.5)
    blind = MarkovLM.random(V, g, spread=2.0, zero_frac=0.5)
    assert (blind.transition == 0).any()
    for draft, one_hot in ((target.blend(blind, 0.7), True), (blind, False)):
        pv = joint_pvalue(loop_counts(block.rejection_sample, target, draft, 4, g, one_hot=one_hot), target)
        assert pv > SIGNIFICANCE, f"one_hot={one_hot}: p={pv:.2e} (detects TV >= {detects():.3f})"


@pytest.mark.slow
def test_mutant_case_passes_with_the_real_rule():
    target, draft, g = toy_pair(**MUTANT_CASE)
    pv = joint_pvalue(loop_counts(block.rejection_sample, target, draft, MUTANT_GAMMA, g), target)
    assert pv > SIGNIFICANCE, f"p={pv:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name", MUTANTS)
def test_loop_law_rejects_mutant(name, mutate):
    target, draft, g = toy_pair(**MUTANT_CASE)
    counts = loop_counts(mutate(name), target, draft, MUTANT_GAMMA, g)
    pv = joint_pvalue(counts, target)
    tv = stats.tv_distance(counts / counts.sum(), target.joint([0], L))
    assert pv < SIGNIFICANCE, f"the loop-law test cannot see the bug in {name} (p={pv:.2e}, measured TV {tv:.4f})"


def test_the_standard_rule_passes_the_same_loop_test():
    """The harness is the one lesson 02 trusts: the token-wise rule passes it too (fast: n = 10k)."""
    target, draft, g = toy_pair(seed=1)
    assert joint_pvalue(loop_counts(token_wise, target, draft, 3, g, n=10_000), target) > SIGNIFICANCE


# ----------------------------------------------------------------------------------------------
# Against the paper, transcribed position by position in plain Python


def block_step_by_hand(drafts, p, q, u, e):
    """Algorithm 2 for one request, scalars and lists: the tokens to append. q None: one-hot drafts."""
    drafts = list(drafts)
    if -1 in drafts:
        drafts = drafts[:drafts.index(-1)]  # the drafts end at the first placeholder
    k = len(drafts)
    q = [torch.nn.functional.one_hot(torch.tensor(x), p.shape[1]).double() for x in drafts] if q is None \
        else [q[i] for i in range(k)]
    rho = [1.0]
    for i, x in enumerate(drafts):
        q_x, p_x = float(q[i][x]), float(p[i][x])
        rho.append(min(rho[-1] * p_x / q_x, 1.0) if q_x > 0 else 0.0)
    tau = 0
    for i in range(1, k + 1):
        if i < k:
            z = float((rho[i] * p[i] - q[i]).clamp(min=0).sum())
            h = z / (z + 1 - rho[i]) if z + 1 - rho[i] > 0 else 1.0
        else:
            h = rho[k]
        if u[i - 1] <= h:
            tau = i  # keep the LAST i that passes
    r = p[k] if tau == k else (rho[tau] * p[tau] - q[tau]).clamp(min=0)
    if float(r.max()) <= 0:
        r = p[tau]
    return drafts[:tau] + [int((r / e).argmax())]


def ragged_case(seed, B=40, max_k=6, Vb=11, one_hot=False, placeholder_frac=0.0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(0, max_k + 1, (B,), generator=g)
    T = int(k.sum())
    p = random_rows(T + B, Vb, g, spread=1.0)
    q = random_rows(T, Vb, g, spread=2.0)
    drafts = torch.multinomial(q, 1, generator=g).flatten() if T else torch.empty(0, dtype=torch.long)
    drafts = torch.where(torch.rand(T, generator=g) < placeholder_frac, -1, drafts)
    return dict(draft_token_ids=drafts, num_draft_tokens=k, target_probs=p, draft_probs=None if one_hot else q,
                uniforms=torch.rand(T, generator=g, dtype=torch.float64).clamp(min=1e-300),
                noise=torch.empty(B, Vb, dtype=torch.float64).exponential_(generator=g))


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("placeholder_frac", [0.0, 0.15])
def test_matches_the_algorithm_transcribed_by_hand(one_hot, placeholder_frac):
    case = ragged_case(1 + one_hot, one_hot=one_hot, placeholder_frac=placeholder_frac)
    out = block.rejection_sample(**case)
    cu = 0
    for r, k in enumerate(case["num_draft_tokens"].tolist()):
        p = case["target_probs"][cu + r:cu + r + k + 1]
        q = None if one_hot else case["draft_probs"][cu:cu + k]
        want = block_step_by_hand(case["draft_token_ids"][cu:cu + k].tolist(), p, q,
                                  case["uniforms"][cu:cu + k].tolist(), case["noise"][r])
        got = out[r][out[r] >= 0].tolist()
        assert got == want, f"request {r} (k={k}): {got} != {want}"
        assert (out[r, len(got):] == -1).all()
        cu += k


def test_registered_under_vllms_name():
    assert RULES["block"] is block.rejection_sample and get_rule("block") is block.rejection_sample
    case = ragged_case(3)
    assert torch.equal(rejection_sample_by_name(**case, method="block"), block.rejection_sample(**case))


def test_keeps_a_draft_the_token_wise_rule_rejects():
    """The crux, by hand: X_1 fails token-wise (p/q = 0.5 < u) yet the block X_1 X_2 is kept."""
    p = torch.tensor([[0.25, 0.75], [0.0, 1.0], [0.5, 0.5]], dtype=torch.float64)  # p(X_2 = 1 | X_1) = 1
    q = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    args = dict(uniforms=torch.tensor([0.9, 0.9], dtype=torch.float64), noise=torch.ones(1, 2, dtype=torch.float64))
    assert token_wise([0, 1], [2], p, q, **args)[0].tolist() == [1, -1, -1]  # rejected, recovered from p - q
    # rho_1 = 0.5, rho_2 = min(0.5 * 1 / 0.5, 1) = 1 = h_2: the last test passes whatever u_1 did
    assert block.rejection_sample([0, 1], [2], p, q, **args)[0, :2].tolist() == [0, 1]


# ----------------------------------------------------------------------------------------------
# Accepted drafts: >= the token-wise rule's, exactly, and strictly more where the theory says


def exact_accepted(target, draft, gamma, start=0):
    """(block, token-wise) E[accepted drafts] after `start`, by enumerating every draft block."""
    seqs = torch.cartesian_prod(*[torch.arange(V)] * gamma).reshape(-1, gamma)
    ctx = torch.cat([torch.full((len(seqs), 1), start), seqs], 1)
    q, p = draft.transition[ctx[:, :-1]], target.transition[ctx]
    w = q.gather(2, seqs[:, :, None])[:, :, 0].prod(1)
    e_block, e_token = block.expected_accepted(p, q, seqs)
    return float((w * e_block).sum()), float((w * e_token).sum())


@pytest.mark.parametrize("seed", range(6))
def test_expected_accepted_at_least_token_wise_strictly_from_gamma_2(seed):
    target, draft, _ = toy_pair(seed, weight=0.3 + 0.1 * seed)
    e1 = exact_accepted(target, draft, 1)
    assert e1[0] == pytest.approx(e1[1], abs=1e-12), "gamma = 1: block verification is the token-wise rule"
    for gamma in (2, 3, 5):
        e_block, e_token = exact_accepted(target, draft, gamma)
        assert e_block > e_token + 1e-4, f"gamma={gamma}: block {e_block:.5f} <= token-wise {e_token:.5f}"


def test_no_gain_with_one_hot_drafts_or_p_equal_q():
    """A deterministic draft: token-wise already keeps X_1..X_i with prob. prod p_j(X_j), the most an
    exact rule can; p == q: both keep everything."""
    g = torch.Generator().manual_seed(4)
    k = 5
    p = random_rows(64 * (k + 1), 7, g).reshape(64, k + 1, 7)
    drafts = torch.randint(0, 7, (64, k), generator=g)
    one_hot = torch.nn.functional.one_hot(drafts, 7).double()
    e_block, e_token = block.expected_accepted(p, one_hot, drafts)
    torch.testing.assert_close(e_block, e_token, rtol=0, atol=1e-12)
    e_block, e_token = block.expected_accepted(p, p[:, :k], drafts)
    assert torch.allclose(e_block, torch.full_like(e_block, k)) and torch.allclose(e_token, e_block)


@pytest.mark.slow
def test_sampled_acceptance_matches_the_exact_expectation():
    """The rule's mean accepted drafts (N draws) equals expected_accepted (z < 4.5), and beats the
    token-wise rule's on the same drafts."""
    target, draft, g = toy_pair(seed=2, weight=0.7)
    gamma, n = 4, N
    ctx, q = [torch.zeros(n, dtype=torch.long)], []
    for _ in range(gamma):
        q.append(draft.transition[ctx[-1]])
        ctx.append(torch.multinomial(q[-1], 1, generator=g).flatten())
    drafts = torch.stack(ctx[1:], 1)
    p, q = target.transition[torch.stack(ctx, 1)], torch.stack(q, 1)  # (n, gamma + 1, V), (n, gamma, V)
    want_block, want_token = exact_accepted(target, draft, gamma)
    for rule, want in ((block.rejection_sample, want_block), (token_wise, want_token)):
        out = rule(drafts.reshape(-1), [gamma] * n, p.reshape(-1, V), q.reshape(-1, V), generator=g)
        accepted = ((out >= 0).sum(1) - 1).double()
        z = (accepted.mean() - want) / (accepted.std() / n ** 0.5)
        assert abs(z) < 4.5, f"{rule.__module__}: mean accepted {accepted.mean():.4f} vs exact {want:.4f}"
    assert want_block > want_token + 0.05


def test_gain_table_no_gain_at_temperature_0():
    target, draft = block.toy_pair(vocab_size=3)
    rows = block.gain_table(target, draft, gammas=range(1, 6))
    by = {(r["temperature"], r["gamma"]): r for r in rows}
    for gamma in range(1, 6):
        assert by[(0.0, gamma)]["gain"] == pytest.approx(0.0, abs=1e-12), "T = 0: block is greedy"
        assert by[(1.0, gamma)]["block"] >= by[(1.0, gamma)]["token_wise"] - 1e-12
    assert by[(1.0, 1)]["gain"] == pytest.approx(0.0, abs=1e-12)
    gains = [by[(1.0, gamma)]["gain"] for gamma in range(2, 6)]
    assert gains[0] > 0 and all(b > a for a, b in zip(gains, gains[1:])), gains
    # the table's token-wise column is the closed form (1 - a^(g+1)) / (1 - a) when p, q are i.i.d.
    iid_t, iid_d = MarkovLM(target.transition[:1].repeat(3, 1)), MarkovLM(draft.transition[:1].repeat(3, 1))
    alpha = float(stats.acceptance_prob(iid_t.transition[0], iid_d.transition[0]))
    assert block.expected_tokens_per_step(iid_t, iid_d, 3)[1] == pytest.approx(stats.expected_tokens(alpha, 3))


# ----------------------------------------------------------------------------------------------
# Greedy rows, edge cases


@pytest.mark.parametrize("mode", ["greedy", "mixed"])
def test_greedy_rows_are_the_greedy_rule(mode):
    case = ragged_case(6, B=64, placeholder_frac=0.05)
    p = case["target_probs"]
    r = torch.repeat_interleave(torch.arange(64), case["num_draft_tokens"])
    rows = torch.arange(case["draft_token_ids"].numel()) + r
    argmax_drafts = torch.rand(len(rows), generator=torch.Generator().manual_seed(0)) < 0.7
    case["draft_token_ids"] = torch.where(argmax_drafts & (case["draft_token_ids"] >= 0), p[rows].argmax(-1),
                                          case["draft_token_ids"])
    greedy = True if mode == "greedy" else torch.rand(64, generator=torch.Generator().manual_seed(1)) < 0.5
    got, want = block.rejection_sample(**case, greedy=greedy), token_wise(**case, greedy=greedy)
    g_rows = torch.ones(64, dtype=torch.bool) if greedy is True else greedy
    assert torch.equal(got[g_rows], want[g_rows])
    assert ((got[g_rows] >= 0).sum(1) > 1).any(), "some greedy request kept a draft"
    if mode == "mixed":  # random rows are block verification's, as if verified alone
        alone = block.rejection_sample(**case, greedy=False)
        assert torch.equal(got[~g_rows], alone[~g_rows])


def test_k_zero_emits_a_sample_of_p():
    g = torch.Generator().manual_seed(7)
    p = random_rows(1, 6, g)
    n = 30_000
    out = block.rejection_sample(torch.empty(0, dtype=torch.long), [0] * n, p.float().repeat(n, 1), None,
                                 generator=g)
    assert out.shape == (n, 1)
    assert stats.chi2_gof(np.bincount(out[:, 0].numpy(), minlength=6), p[0].numpy()) > SIGNIFICANCE
    empty = block.rejection_sample(torch.empty(0, dtype=torch.long), [], torch.empty(0, 6), None)
    assert empty.shape == (0, 1)


def test_a_placeholder_ends_the_request_drafts():
    """A -1 at position 3: the same tokens as the request with its first 2 drafts only."""
    g = torch.Generator().manual_seed(8)
    k, Vb = 5, 11
    p, q = random_rows(k + 1, Vb, g, spread=1.0), random_rows(k, Vb, g, spread=1.0)
    drafts = torch.multinomial(q, 1, generator=g).flatten()
    drafts[2] = -1
    u, e = torch.full((k,), 0.5, dtype=torch.float64), torch.empty(1, Vb).exponential_(generator=g)
    for seed in range(20):  # many uniforms: both endings (bonus from row 2, residual) are reached
        u = torch.rand(k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        got = block.rejection_sample(drafts, [k], p, q, uniforms=u, noise=e)
        want = block.rejection_sample(drafts[:2], [2], p[:3], q[:2], uniforms=u[:2], noise=e)
        assert got[0, :3].tolist() == want[0].tolist() and (got[0, 3:] == -1).all()
    every = block.rejection_sample(torch.full((k,), -1), [k], p, q, uniforms=u, noise=e)
    assert every[0, 1:].tolist() == [-1] * k and every[0, 0] == int((p[0] / e[0]).argmax())


def test_one_hot_draft_rows_equal_no_draft_probs():
    case = ragged_case(9, B=32)
    one_hot = torch.nn.functional.one_hot(case["draft_token_ids"], 11).double()
    assert torch.equal(block.rejection_sample(**dict(case, draft_probs=one_hot)),
                       block.rejection_sample(**dict(case, draft_probs=None)))


def test_p_one_hot_emits_the_targets_tokens():
    case = ragged_case(10, B=32)
    top = case["target_probs"].argmax(-1)
    p = torch.nn.functional.one_hot(top, 11).double()
    out = block.rejection_sample(**dict(case, target_probs=p))
    cu = 0
    for r, k in enumerate(case["num_draft_tokens"].tolist()):
        row = out[r][out[r] >= 0]
        assert row.tolist() == top[cu + r:cu + r + len(row)].tolist(), "a deterministic target's tokens"
        cu += k


def test_p_equal_q_keeps_every_draft_and_q_zero_never_passes():
    case = ragged_case(11, B=32)
    r = torch.repeat_interleave(torch.arange(32), case["num_draft_tokens"])
    rows = torch.arange(case["draft_token_ids"].numel()) + r
    same = dict(case, draft_probs=case["target_probs"][rows])
    out = block.rejection_sample(**same)
    assert torch.equal((out[:, :-1] >= 0).sum(1) + (out[:, -1] >= 0), case["num_draft_tokens"] + 1)
    # q(X_1) = 0: X_1 (so every later draft) is never kept
    q = case["draft_probs"].clone()
    cu = torch.cumsum(case["num_draft_tokens"], 0) - case["num_draft_tokens"]
    has = case["num_draft_tokens"] > 0
    q[cu[has], case["draft_token_ids"][cu[has]]] = 0
    q = q / q.sum(-1, keepdim=True)
    assert ((block.rejection_sample(**dict(case, draft_probs=q))[has] >= 0).sum(1) == 1).all()


def test_bad_input_gets_the_layouts_errors():
    case = ragged_case(12, B=3)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        block.rejection_sample(**dict(case, num_draft_tokens=case["num_draft_tokens"] + 1))
    with pytest.raises(ValueError, match="uniforms"):
        block.rejection_sample(**dict(case, uniforms=case["uniforms"].float()))
    with pytest.raises(ValueError, match="vocab"):
        block.rejection_sample(**dict(case, draft_probs=case["draft_probs"][:, :5]))


# ----------------------------------------------------------------------------------------------
# In the engine: tiny random Llamas over 8 tokens (as tests/test_06_spec_engine.py), whose exact
# joint law over the first 3 generated tokens transformers' forward gives.

EV, EL, EPROMPT = 8, 3, [1, 2, 3, 1, 2]


def block_engine(target, draft, method="block", k=3, **kw):
    proposer = DraftModelProposer(load_llama(draft), k, num_kv_blocks=4096, block_size=4,
                                  sample_method="probabilistic")  # draft_probs: where block verification pays
    knobs = {"num_kv_blocks": 2048, "block_size": 4, "max_num_seqs": 4096, "max_num_batched_tokens": 1 << 16,
             "verifier": "torch", **kw}  # the torch rule, also on a machine with a GPU (the kernel: test_10_block_kernel)
    plumbed = "rejection_sample_method" in {f.name for f in fields(EngineConfig)}
    if plumbed:  # the engine's own path, from speculative_config["rejection_sample_method"]
        knobs["rejection_sample_method"] = method
    eng = LLMEngine(load_llama(target), proposer=proposer, **knobs)
    if not plumbed:  # before the engine read the key: the rule goes into the runner's one verifier
        eng.runner.verifier = RULES[method]
    assert eng.runner.verifier is RULES[method]
    return eng


def test_engine_greedy_with_block_verification_is_plain_greedy(llama_pair):
    _, target, draft = llama_pair
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, EV, (n,), generator=g).tolist() for n in (1, 4, 9, 17)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = run_engine(LLMEngine(load_llama(target), num_kv_blocks=2048, block_size=4), prompts, params)
    for knobs in ({}, {"num_kv_blocks": 24}, {"max_num_batched_tokens": 6, "max_num_seqs": 6}):
        eng = block_engine(target, draft, **knobs)
        assert run_engine(eng, prompts, params) == plain, knobs
        assert eng.stats.num_accepted_tokens > 0 and eng.kv.num_free_blocks == eng.kv.pool.num_blocks
        if "num_kv_blocks" in knobs:
            assert eng.scheduler.num_preemptions > 0, "the pool was meant to force preemption"


@pytest.mark.slow  # chi2 over 5000 engine samples, twice (about a minute alone)
def test_engine_samples_follow_the_target_and_accept_at_least_as_much(llama_pair):
    """Unseeded requests at T = 1 (the engine's stream: the rule decides). Seeded requests are
    verified against position-keyed samples (one-hot rows), where block verification is the greedy rule."""
    hf, target, draft = llama_pair
    seqs = torch.tensor([EPROMPT + [a, b] for a in range(EV) for b in range(EV)])
    with torch.no_grad():
        probs = logits_to_probs(hf(seqs).logits.double())  # (V*V, len + 2, V)
    n0 = len(EPROMPT)
    joint = probs[0, n0 - 1][:, None, None] * probs[:, n0].reshape(EV, EV, EV)[:, 0][:, :, None] \
        * probs[:, n0 + 1].reshape(EV, EV, EV)  # P(x1, x2, x3 | prompt)
    n = 5000
    params = SamplingParams(temperature=1.0, max_tokens=EL + 2, ignore_eos=True)
    rates = {}
    for name in ("block", "standard"):
        eng = block_engine(target, draft, method=name)
        counts = np.zeros((EV,) * EL)
        for out in run_engine(eng, [EPROMPT] * n, params):
            counts[tuple(out[:EL])] += 1
        pv = stats.chi2_gof(counts.ravel(), joint.ravel().numpy())
        assert pv > SIGNIFICANCE, f"{name}: engine samples differ from the target (p={pv:.1e}; detects TV >= " \
                                  f"{stats.min_detectable_tv(n, int((joint.ravel() * n >= 5).sum()) + 1):.3f})"
        s = eng.stats
        rates[name] = (s.num_accepted_tokens / s.num_drafts, s.num_drafts)
    (block_len, nb), (std_len, ns) = rates["block"], rates["standard"]
    print(f"accepted drafts per step (k = 3): block {block_len:.3f}, standard {std_len:.3f}")
    assert block_len > std_len - 4 * np.sqrt(3.0 / min(nb, ns)), rates  # accepted per step: not fewer
