"""rejection_sample and verify_step: exact cases, edge cases, layout and error messages."""

import pytest
import torch

from helpers import random_rows
from speclab.sampling import logits_to_probs
from speclab.verify import PLACEHOLDER_TOKEN_ID, rejection_sample, verify_greedy_step, verify_step

L = torch.long


def one_hot(ids, V):
    return torch.nn.functional.one_hot(torch.as_tensor(ids), V).float()


def test_hand_computed_accept_reject_and_recovered():
    # V = 3, k = 2. p/q at draft 0 = 0.5/0.5 = 1 (accept for any u); at draft 1 = 0.1/0.8 = 0.125.
    p = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.1, 0.5, 0.4], [0.1, 0.8, 0.1]])
    drafts = torch.tensor([1, 1])
    u_reject = torch.tensor([0.9, 0.5], dtype=torch.float64)  # 0.5 > 0.125: reject draft 1
    out = rejection_sample(drafts, [2], p, q, uniforms=u_reject, noise=torch.ones(1, 3))
    # residual max(p1 - q1, 0) = [0, 0, 0.7]: the recovered token must be 2, whatever the noise
    assert out.tolist() == [[1, 2, -1]]
    u_accept = torch.tensor([0.9, 0.1], dtype=torch.float64)  # 0.1 <= 0.125: accept; bonus from p2 = [1, 0, 0]
    assert rejection_sample(drafts, [2], p, q, uniforms=u_accept).tolist() == [[1, 1, 0]]


def test_acceptance_boundary_is_p_over_q_at_least_u():
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    q = torch.tensor([[0.5, 0.5]])
    at = torch.tensor([0.5], dtype=torch.float64)  # p/q = 0.5 exactly: accepted
    above = torch.tensor([0.5 + 1e-12], dtype=torch.float64)
    assert rejection_sample(torch.tensor([0]), [1], p, q, uniforms=at)[0, 0] == 0
    assert rejection_sample(torch.tensor([0]), [1], p, q, uniforms=above, noise=torch.ones(1, 2))[0].tolist() == [1, -1]


def test_k_zero_everywhere_emits_one_bonus_token_each():
    p = one_hot([3, 1, 4], 5)
    out = rejection_sample(torch.empty(0, dtype=L), [0, 0, 0], p)
    assert out.tolist() == [[3], [1], [4]]


def test_ragged_layout_and_padding():
    # request 0: k=2 (rows 0,1 + bonus 2); request 1: k=0 (bonus 3); request 2: k=3 (rows 4,5,6 + bonus 7)
    V = 6
    target = one_hot([1, 2, 5, 4, 0, 3, 3, 2], V)
    drafts = torch.tensor([1, 2, 0, 3, 1])  # r0 all accepted; r2 accepts 0, 3 then rejects 1 (argmax is 3)
    out = rejection_sample(drafts, [2, 0, 3], target, greedy=True)
    assert out.tolist() == [[1, 2, 5, -1], [4, -1, -1, -1], [0, 3, 3, -1]]
    # the same one-hot targets sampled at random agree: one-hot p accepts its token, rejects the rest
    out_random = rejection_sample(drafts, [2, 0, 3], target, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, out_random)


def test_mixed_greedy_and_random_batch():
    g = torch.Generator().manual_seed(1)
    V, k = 7, 3
    p = random_rows(2 * (k + 1), V, g).float()
    q = random_rows(2 * k, V, g).float()
    drafts = torch.multinomial(q, 1, generator=g).flatten()
    u = torch.rand(2 * k, dtype=torch.float64, generator=g)
    noise = torch.empty(2, V).exponential_(generator=g)
    mixed = rejection_sample(drafts, [k, k], p, q, greedy=torch.tensor([True, False]), uniforms=u, noise=noise)
    all_greedy = rejection_sample(drafts, [k, k], p, q, greedy=True, uniforms=u, noise=noise)
    all_random = rejection_sample(drafts, [k, k], p, q, greedy=False, uniforms=u, noise=noise)
    assert torch.equal(mixed[0], all_greedy[0]) and torch.equal(mixed[1], all_random[1])
    expected = verify_greedy_step(drafts[:k].tolist(), p[:k + 1])
    assert mixed[0].tolist() == expected + [-1] * (k + 1 - len(expected))


def test_placeholder_drafts_are_rejected_and_replaced_by_a_sample_of_p():
    p = one_hot([2, 0], 4)
    out = rejection_sample(torch.tensor([PLACEHOLDER_TOKEN_ID]), [1], p, generator=torch.Generator().manual_seed(0))
    assert out.tolist() == [[2, -1]]  # p is one-hot on 2: a placeholder is rejected, 2 drawn from p
    q = torch.full((1, 4), 0.25)
    out = rejection_sample(torch.tensor([-1]), [1], p, q, generator=torch.Generator().manual_seed(0))
    assert out.tolist() == [[2, -1]]
    out = rejection_sample(torch.tensor([-1]), [1], p, torch.zeros(1, 4), generator=torch.Generator().manual_seed(0))
    assert out.tolist() == [[2, -1]]  # a placeholder's q row may be empty: it is never read


def test_draft_with_zero_draft_probability_is_always_rejected():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.0, 1.0, 0.0]])  # the draft token 0 has q = 0
    for seed in range(20):
        out = rejection_sample(torch.tensor([0]), [1], p, q, generator=torch.Generator().manual_seed(seed))
        assert out.tolist() == [[0, -1]]  # rejected; the residual max(p - q, 0) = [0.5, 0, 0] gives 0


def test_p_equals_q_accepts_everything_whatever_the_uniforms():
    g = torch.Generator().manual_seed(2)
    p = random_rows(6, 50, g).float()
    drafts = torch.multinomial(p[:5], 1, generator=g).flatten()
    u = torch.full((5,), 1 - 1e-16, dtype=torch.float64)
    out = rejection_sample(drafts, [5], p, p[:5].clone(), uniforms=u)
    assert torch.equal(out[0, :5], drafts)


def test_given_uniforms_and_noise_the_output_is_determined():
    g = torch.Generator().manual_seed(3)
    p, q = random_rows(12, 37, g).float(), random_rows(9, 37, g).float()
    drafts = torch.multinomial(q, 1, generator=g).flatten()
    u = torch.rand(9, dtype=torch.float64, generator=g)
    e = torch.empty(3, 37).exponential_(generator=g)
    a = rejection_sample(drafts, [4, 0, 5], p, q, uniforms=u, noise=e, generator=torch.Generator().manual_seed(1))
    b = rejection_sample(drafts, [4, 0, 5], p, q, uniforms=u, noise=e, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b)
    c = rejection_sample(drafts, [4, 0, 5], p, q, generator=torch.Generator().manual_seed(9))
    d = rejection_sample(drafts, [4, 0, 5], p, q, generator=torch.Generator().manual_seed(9))
    assert torch.equal(c, d)


def test_argmax_ties_break_to_the_first_index_in_greedy_rows():
    p = torch.tensor([[0.0, 0.5, 0.5], [0.4, 0.2, 0.4]])
    assert rejection_sample(torch.tensor([2]), [1], p, greedy=True).tolist() == [[1, -1]]
    assert rejection_sample(torch.tensor([1]), [1], p, greedy=True).tolist() == [[1, 0]]
    # the engine's greedy step (max(-1).indices, faster than argmax on a CPU) breaks ties the same way
    assert verify_greedy_step([2], p) == [1] and verify_greedy_step([1], p) == [1, 0]
    ties = torch.randn(9, 49152, generator=torch.Generator().manual_seed(0)).round()  # many tied maxima
    assert verify_greedy_step([-1], ties) == [int(ties[0].argmax())]


def test_temperature_zero_probs_make_random_verification_greedy():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 11, generator=g)
    p = logits_to_probs(logits, temperature=0.0)
    drafts = logits[:4].argmax(-1)
    drafts[2] = (drafts[2] + 1) % 11
    out = rejection_sample(drafts, [4], p, generator=g)
    assert out.tolist() == [verify_greedy_step(drafts.tolist(), logits)[:3] + [-1, -1]]


def test_non_power_of_two_vocab_reaches_its_last_token():
    V = 50_257
    p = one_hot([V - 1, V - 1, 3], V)
    out = rejection_sample(torch.tensor([V - 1, 5]), [2], p, generator=torch.Generator().manual_seed(0))
    assert out.tolist() == [[V - 1, V - 1, -1]]  # accepted, then recovered from the vocabulary's tail


def test_verify_step_and_rejection_sample_accept_the_same_drafts():
    g = torch.Generator().manual_seed(6)
    for _ in range(200):
        k = int(torch.randint(0, 6, (1,), generator=g))
        p, q = random_rows(k + 1, 9, g).float(), random_rows(k, 9, g).float()
        drafts = torch.multinomial(q, 1, generator=g).flatten() if k else torch.empty(0, dtype=L)
        u = torch.rand(k, dtype=torch.float64, generator=g).clamp(min=1e-300)
        a = verify_step(drafts.tolist(), p, q, uniforms=u, generator=g)
        b = rejection_sample(drafts, [k], p, q, uniforms=u)[0]
        b = b[b >= 0].tolist()
        assert a[:-1] == b[:-1]  # same accepted drafts; the final token is random in both


@pytest.mark.parametrize("bad,match", [
    (dict(num_draft_tokens=[3]), "num_draft_tokens sums to 3"),
    (dict(num_draft_tokens=[-1, 3]), ">= 0"),
    (dict(target_probs=torch.full((2, 4), 0.25)), r"\(T \+ B, V\) = \(3, V\)"),
    (dict(target_probs=torch.randn(3, 4)), "softmax"),
    (dict(target_probs=torch.full((3, 4), 0.3)), "sums to 1.2"),
    (dict(draft_probs=torch.full((2, 5), 0.2)), "draft vocab size 5 != target vocab size 4"),
    (dict(draft_probs=torch.full((1, 4), 0.25)), r"\(T, V\) = \(2, 4\)"),
    (dict(draft_token_ids=torch.tensor([0, 4])), "outside the vocabulary"),
    (dict(uniforms=torch.rand(2)), "float64"),
    (dict(uniforms=torch.zeros(2, dtype=torch.float64)), "strictly inside"),
    (dict(uniforms=torch.rand(3, dtype=torch.float64)), r"shape \(T,\) = \(2,\)"),
    (dict(noise=torch.ones(2, 4)), r"\(B, V\) = \(1, 4\)"),
    (dict(noise=torch.zeros(1, 4)), "strictly positive"),
    (dict(greedy=torch.tensor([True, False])), "greedy must be"),
])
def test_malformed_inputs_get_clear_errors(bad, match):
    args = dict(draft_token_ids=torch.tensor([0, 1]), num_draft_tokens=[2],
                target_probs=torch.full((3, 4), 0.25), draft_probs=None)
    args.update(bad)
    kwargs = {key: args.pop(key) for key in ("uniforms", "noise", "greedy") if key in args}
    with pytest.raises(ValueError, match=match):
        rejection_sample(*args.values(), **kwargs)
