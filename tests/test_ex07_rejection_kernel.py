"""Grades exercise 07: the accept walk on vLLM's inclusive cu_num_draft_tokens, against speclab's reference.

Your `accept_kernel` runs inside lesson 07's pipeline (greedy kernel, your kernel, end-token kernel),
so the whole output must equal speclab.verify.rejection_sample bit for bit; a failure names the request,
its draft rows and the accepted count n you stored. Negative controls at the bottom (skipped under
--impl=exercises) prove that each check fails plausible wrong kernels.

    .venv/bin/python -m pytest tests/test_ex07_rejection_kernel.py                     # the reference solution
    .venv/bin/python -m pytest --impl=exercises tests/test_ex07_rejection_kernel.py    # your answer in exercises/
"""

import pytest
import torch
import triton
import triton.language as tl

from speclab.kernels.rejection_sample import interpreted, launch_end_tokens, launch_greedy, prepare_batch
from speclab.verify import rejection_sample
from tests.helpers import fail_on, on_device

EXERCISE = "ex07_rejection_kernel"

pytestmark = pytest.mark.exercise

DEVICE = "cpu" if interpreted() else "cuda"  # compiled kernels (on a GPU) read GPU memory only


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


def run(kernel, batch, greedy=False, **extra):
    """Lesson 07's pipeline with `kernel` as the accept walk, launched with vLLM's inclusive offsets
    (on DEVICE; the outputs come back to the CPU)."""
    b = prepare_batch(**on_device(batch, DEVICE), greedy=on_device(greedy, DEVICE))
    launch_greedy(b, block_v=32)
    q = b.draft_probs if b.draft_probs is not None else b.target_probs  # a dummy when one-hot
    cu_num_draft_tokens = torch.cumsum(b.k, 0).contiguous()  # inclusive, as vLLM's SpecDecodeMetadata
    kernel[(b.k.numel(),)](
        b.out, b.out.stride(0), b.num_accepted, b.draft_token_ids, cu_num_draft_tokens, b.is_greedy,
        b.target_probs, b.target_probs.stride(0), b.target_probs.stride(1),
        q, q.stride(0), q.stride(1), b.uniforms, NO_DRAFT_PROBS=b.draft_probs is None, num_warps=1, **extra)
    launch_end_tokens(b, block_v=32)  # writes the recovered or bonus token at column n
    b.out, b.num_accepted = b.out.cpu(), b.num_accepted.cpu()
    return b


def check(kernel, batch, greedy=False, **extra):
    want = rejection_sample(**batch, greedy=greedy)
    b = run(kernel, batch, greedy, **extra)
    if torch.equal(b.out, want):
        return None
    k = batch["num_draft_tokens"].tolist()
    cu = torch.cumsum(torch.tensor(k), 0).tolist()
    is_greedy = torch.as_tensor(greedy).expand(len(k))
    for r in range(len(k)):
        if torch.equal(b.out[r], want[r]):
            continue
        start = cu[r - 1] if r else 0
        n_want = int((want[r] >= 0).sum()) - 1
        x = batch["draft_token_ids"][start:start + k[r]].tolist()
        u = batch["uniforms"][start:start + k[r]]
        p = batch["target_probs"][[start + r + i for i in range(k[r])], [max(t, 0) for t in x]]
        q = torch.ones_like(p) if batch["draft_probs"] is None else \
            batch["draft_probs"][[start + i for i in range(k[r])], [max(t, 0) for t in x]]
        ratio = [round(float(a / b_), 4) if b_ > 0 else "q=0" for a, b_ in zip(p, q)]
        what = "greedy: your kernel must return at once and leave the row to the greedy kernel" if bool(is_greedy[r]) \
            else f"p/q per draft {ratio} against u {[round(float(v), 4) for v in u]}"
        where = f"cu_num_draft_tokens[{r - 1}], cu_num_draft_tokens[{r}] = {start}, {cu[r]}" if r else \
            f"request 0 starts at row 0 (there is no cu[-1]) and cu_num_draft_tokens[0] = {cu[0]}"
        return (f"request {r}: {where}, so its drafts are rows "
                f"{start}..{cu[r] - 1} = {x} and its target rows start at {start} + {r}; {what}. "
                f"Want n = {n_want} accepted and row {want[r].tolist()}; you stored n = {int(b.num_accepted[r])}, "
                f"row {b.out[r].tolist()}. (Accept iff x >= 0, q > 0 and p/q >= u, stop at the first rejection.)")
    return "outputs differ"


def boundary_batches():
    batch = ragged_batch(4, 6, 3, 40)
    p, q, x = batch["target_probs"], batch["draft_probs"], batch["draft_token_ids"]
    k = batch["num_draft_tokens"]
    rows = torch.arange(x.numel()) + torch.repeat_interleave(torch.arange(k.numel()), k)
    ratio = (p[rows, x] / q[torch.arange(x.numel()), x]).to(torch.float64)  # divided in float32
    return [dict(batch, uniforms=u.clamp(max=1 - 2 ** -53))
            for u in (ratio, torch.nextafter(ratio, torch.full_like(ratio, 2.0)))]


def q_zero_batch():
    batch = ragged_batch(3, 6, 3, 40)
    q, x = batch["draft_probs"].clone(), batch["draft_token_ids"]
    q[torch.arange(q.shape[0]), x] = 0.0
    tiny_u = torch.full_like(batch["uniforms"], 1e-9)  # p / q >= u would accept: only q > 0 rejects
    return dict(batch, draft_probs=q / q.sum(-1, keepdim=True), uniforms=tiny_u)


def test_ragged_batch_with_draft_probs(impl):
    fail_on(check(impl.accept_kernel, ragged_batch(0, 12, 6, 50)))


def test_first_request_reads_from_row_zero(impl):
    """r = 0 has no cu[r - 1]: its drafts start at row 0 (a masked load, not cu[-1])."""
    fail_on(check(impl.accept_kernel, ragged_batch(8, 1, 5, 30)))
    fail_on(check(impl.accept_kernel, ragged_batch(9, 3, 4, 30)))


def test_one_hot_drafts_and_placeholders(impl):
    fail_on(check(impl.accept_kernel, ragged_batch(1, 12, 6, 50, one_hot=True, placeholder_frac=0.2)))
    fail_on(check(impl.accept_kernel, ragged_batch(2, 12, 6, 50, placeholder_frac=0.2)))


def test_q_zero_on_the_draft_rejects(impl):
    fail_on(check(impl.accept_kernel, q_zero_batch()))


def test_accept_boundary_u_equal_to_the_ratio(impl):
    """u == p(x) / q(x) accepts (>=); the next float64 above it rejects."""
    for batch in boundary_batches():
        fail_on(check(impl.accept_kernel, batch))


def test_all_accepted_when_q_is_p_and_requests_without_drafts(impl):
    batch = ragged_batch(5, 8, 5, 30)
    k = batch["num_draft_tokens"]
    rows = torch.arange(int(k.sum())) + torch.repeat_interleave(torch.arange(k.numel()), k)
    fail_on(check(impl.accept_kernel, dict(batch, draft_probs=batch["target_probs"][rows].clone())))


def test_greedy_requests_are_left_alone(impl):
    """In a mixed batch the greedy kernel owns the greedy rows: return at once for them."""
    greedy = torch.arange(12) % 3 == 0
    fail_on(check(impl.accept_kernel, ragged_batch(6, 12, 6, 50), greedy))
    fail_on(check(impl.accept_kernel, ragged_batch(7, 12, 6, 50, one_hot=True), greedy))


# ---------------------------------------------------------------------------------------------
# Negative controls: one kernel, one classic bug per BUG value.
#   1: reads cu[r] as the *start* (lesson 07's exclusive convention on vLLM's inclusive offsets)
#   2: compares the ratio with u in float32
#   3: keeps walking after a rejection
#   4: no q > 0 guard
#   5: the target row without the + r (draft row used for p)
#   6: greedy requests not skipped


@triton.jit
def mutant_kernel(out_ptr, stride_out, num_accepted_ptr, draft_ptr, cu_num_draft_ptr, is_greedy_ptr,
                  target_ptr, stride_target, stride_target_v,
                  draft_probs_ptr, stride_draft, stride_draft_v, uniforms_ptr,
                  NO_DRAFT_PROBS: tl.constexpr, BUG: tl.constexpr, T: tl.constexpr, TB: tl.constexpr):
    # T, TB: draft and target row counts, so that a buggy row never reads outside its tensor
    r = tl.program_id(0)
    if BUG != 6:
        if tl.load(is_greedy_ptr + r):
            return
    end = tl.load(cu_num_draft_ptr + r)
    start = tl.load(cu_num_draft_ptr + r - 1, mask=r > 0, other=0)
    k = end - start
    if BUG == 1:
        start = end
    n = 0
    rejected = False
    for i in range(0, k):
        if (not rejected) | (BUG == 3):
            inside = start + i < T
            x = tl.load(draft_ptr + start + i, mask=inside, other=-1)
            real = x >= 0
            trow = start + i if BUG == 5 else start + r + i
            p = tl.load(target_ptr + trow * stride_target + x * stride_target_v, mask=real & (trow < TB), other=0.0)
            if NO_DRAFT_PROBS:
                q = tl.full([], 1.0, tl.float32)
            else:
                q = tl.load(draft_probs_ptr + (start + i) * stride_draft + x * stride_draft_v, mask=real, other=0.0)
            u = tl.load(uniforms_ptr + start + i, mask=inside, other=0.5)
            ratio = tl.math.div_rn(p, tl.where(q > 0, q, 1.0))
            ok = (ratio >= u.to(tl.float32)) if BUG == 2 else (ratio.to(tl.float64) >= u)
            guard = real if BUG == 4 else real & (q > 0)
            if guard & ok:
                tl.store(out_ptr + r.to(tl.int64) * stride_out + n, x)
                n += 1
            else:
                rejected = True
    tl.store(num_accepted_ptr + r, n)


def rows(batch):
    T = int(batch["draft_token_ids"].numel())
    return dict(T=T, TB=T + int(batch["num_draft_tokens"].numel()))


def all_checks():
    greedy = torch.arange(12) % 3 == 0
    return [(ragged_batch(0, 12, 6, 50), False), (ragged_batch(1, 12, 6, 50, one_hot=True, placeholder_frac=0.2), False),
            (q_zero_batch(), False), *[(b, False) for b in boundary_batches()], (ragged_batch(6, 12, 6, 50), greedy)]


@pytest.mark.parametrize("bug", [1, 2, 3, 4, 5, 6],
                         ids=["start_at_cu_r", "float32_compare", "walks_past_a_rejection", "no_q_guard",
                              "target_row_without_r", "greedy_not_skipped"])
def test_control_checks_catch(controls, bug):
    messages = [check(mutant_kernel, batch, greedy, BUG=bug, **rows(batch)) for batch, greedy in all_checks()]
    caught = [m for m in messages if m]
    assert caught, f"no check caught BUG={bug}"
    print(caught[0])


def test_control_mutant_kernel_without_bug_passes(controls):
    assert all(check(mutant_kernel, batch, greedy, BUG=0, **rows(batch)) is None for batch, greedy in all_checks())
