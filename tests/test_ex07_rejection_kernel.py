"""Grades exercise 07: the random-sampling kernel's accept/reject walk, against speclab's reference.

Your `accept_kernel` runs inside lesson 07's pipeline (greedy kernel, your kernel, end-token
kernel), so the whole output must equal speclab.verify.rejection_sample bit for bit.

    pytest tests/test_ex07_rejection_kernel.py                     # the reference solution
    pytest --impl=exercises tests/test_ex07_rejection_kernel.py    # your answer in exercises/
"""

import pytest
import torch

from speclab.kernels.rejection_sample import launch_accept, launch_end_tokens, launch_greedy, prepare_batch
from speclab.verify import rejection_sample

EXERCISE = "ex07_rejection_kernel"

pytestmark = pytest.mark.exercise


def ragged_batch(seed, B, max_k, V, *, one_hot=False, placeholder_frac=0.0):
    """Seeded drafts x_i ~ q_i with q_i close to p_i (long accepted runs), explicit uniforms and noise."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(0, max_k + 1, (B,), generator=g)
    T = int(k.sum())
    logits = 2 * torch.randn(T + B, V, generator=g)
    rows = torch.arange(T) + torch.repeat_interleave(torch.arange(B), k)  # verification rows
    q = (logits[rows] + torch.randn(T, V, generator=g)).softmax(-1)  # (T, V)
    drafts = torch.multinomial(q, 1, generator=g).flatten() if T else torch.empty(0, dtype=torch.long)
    drafts = torch.where(torch.rand(T, generator=g) < placeholder_frac, -1, drafts)
    return dict(draft_token_ids=drafts, num_draft_tokens=k, target_probs=logits.softmax(-1),
                draft_probs=None if one_hot else q, uniforms=torch.rand(T, generator=g, dtype=torch.float64),
                noise=torch.empty(B, V).exponential_(generator=g))


def check(impl, batch, greedy=False):
    want = rejection_sample(**batch, greedy=greedy)
    b = prepare_batch(**batch, greedy=greedy)
    launch_greedy(b, block_v=32)
    launch_accept(b, kernel=impl.accept_kernel)  # yours
    launch_end_tokens(b, block_v=32)  # writes the recovered or bonus token at column n
    assert torch.equal(b.out, want), f"output with your kernel\n{b.out}\n!= speclab's reference\n{want}"


def test_ragged_batch_with_draft_probs(impl):
    check(impl, ragged_batch(0, 12, 6, 50))


def test_one_hot_drafts_and_placeholders(impl):
    check(impl, ragged_batch(1, 12, 6, 50, one_hot=True, placeholder_frac=0.2))
    check(impl, ragged_batch(2, 12, 6, 50, placeholder_frac=0.2))


def test_q_zero_on_the_draft_rejects(impl):
    batch = ragged_batch(3, 6, 3, 40)
    q, x = batch["draft_probs"].clone(), batch["draft_token_ids"]
    q[torch.arange(q.shape[0]), x] = 0.0
    tiny_u = torch.full_like(batch["uniforms"], 1e-9)  # p / q >= u would accept: only q > 0 rejects
    check(impl, dict(batch, draft_probs=q / q.sum(-1, keepdim=True), uniforms=tiny_u))


def test_accept_boundary_u_equal_to_the_ratio(impl):
    """u == p(x) / q(x) accepts (>=); the next float64 above it rejects."""
    batch = ragged_batch(4, 6, 3, 40)
    p, q, x = batch["target_probs"], batch["draft_probs"], batch["draft_token_ids"]
    k = batch["num_draft_tokens"]
    rows = torch.arange(x.numel()) + torch.repeat_interleave(torch.arange(k.numel()), k)
    ratio = (p[rows, x] / q[torch.arange(x.numel()), x]).to(torch.float64)  # divided in float32
    for u in (ratio, torch.nextafter(ratio, torch.full_like(ratio, 2.0))):
        check(impl, dict(batch, uniforms=u.clamp(max=1 - 2 ** -53)))


def test_all_accepted_when_q_is_p_and_requests_without_drafts(impl):
    batch = ragged_batch(5, 8, 5, 30)
    k = batch["num_draft_tokens"]
    rows = torch.arange(int(k.sum())) + torch.repeat_interleave(torch.arange(k.numel()), k)
    check(impl, dict(batch, draft_probs=batch["target_probs"][rows].clone()))


def test_greedy_requests_are_left_alone(impl):
    """In a mixed batch the greedy kernel owns the greedy rows: return at once for them."""
    greedy = torch.arange(12) % 3 == 0
    check(impl, ragged_batch(6, 12, 6, 50), greedy)
    check(impl, ragged_batch(7, 12, 6, 50, one_hot=True), greedy)
