"""Lesson 07: the Triton verification kernels equal speclab's torch reference, bit for bit.

Without a GPU the kernels run in Triton's CPU interpreter (conftest.py sets TRITON_INTERPRET=1),
which executes every program in Python: batches and vocabularies stay small, and a small BLOCK_V
(32) makes the multi-block paths (running argmax across tiles, the masked tail) run anyway. With a
GPU they compile for it, and every check runs there: batches are built on the CPU (the same seeded
numbers either way) and moved to DEVICE, where the kernel and the torch reference both run.
"""

import numpy as np
import pytest
import torch

from speclab.verify.backend import get_rejection_sampler
from speclab.kernels import rejection_sample as kernel
from speclab.stats import chi2_gof, min_detectable_tv, tv_distance
from speclab.verify.rejection import rejection_sample as reference  # the standard rule's torch reference
from tests.helpers import on_device

BLOCK_V = 32
DEVICE = "cpu" if kernel.interpreted() else "cuda"  # compiled kernels read GPU memory only


def make_batch(seed, B, max_k, V, *, one_hot=False, placeholder_frac=0.0, dtype=torch.float32):
    """A seeded ragged batch: k_r ~ U{0..max_k}, drafts from q_i (or greedy-friendly argmax drafts).

    q_i is p_i's logits plus noise, so long runs of accepted drafts and bonus tokens happen too.
    Returns the arguments of rejection_sample as a dict (uniforms and noise included).
    """
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(0, max_k + 1, (B,), generator=g)
    T = int(k.sum())
    logits = 2 * torch.randn(T + B, V, generator=g, dtype=torch.float64)
    p = logits.softmax(-1)  # (T + B, V)
    r = torch.repeat_interleave(torch.arange(B), k)  # (T,) request of each draft row
    verify_rows = torch.arange(T) + r  # (T,) target row verifying each draft
    q = (logits[verify_rows] + torch.randn(T, V, generator=g, dtype=torch.float64)).softmax(-1)  # (T, V)
    drafts = torch.multinomial(q, 1, generator=g).flatten() if T else torch.empty(0, dtype=torch.long)
    use_argmax = torch.rand(T, generator=g) < 0.5  # greedy rows need drafts equal to argmax p
    drafts = torch.where(use_argmax, p[verify_rows].argmax(-1), drafts)
    drafts = torch.where(torch.rand(T, generator=g) < placeholder_frac, -1, drafts)
    return dict(draft_token_ids=drafts, num_draft_tokens=k, target_probs=p.to(dtype),
                draft_probs=None if one_hot else q.to(dtype),
                uniforms=torch.rand(T, generator=g, dtype=torch.float64).clamp(min=1e-300),
                noise=torch.empty(B, V, dtype=dtype).exponential_(generator=g).clamp(min=1e-30))


def greedy_flags(mode, B, seed):
    if mode == "mixed":
        return torch.rand(B, generator=torch.Generator().manual_seed(seed + 1)) < 0.5
    return mode == "greedy"


def assert_same(batch, greedy=False, block_v=BLOCK_V):
    """The kernel and the reference on DEVICE, bit for bit; returns the tokens on the CPU."""
    batch, greedy = on_device(batch, DEVICE), on_device(greedy, DEVICE)
    want = reference(**batch, greedy=greedy)
    got = kernel.rejection_sample_blocked(**batch, greedy=greedy, block_v=block_v)
    assert got.dtype == torch.int64 and got.shape == want.shape and got.device == want.device
    assert torch.equal(got, want), f"kernel\n{got}\n!= reference\n{want}"
    return got.cpu()


def test_interpreter_smoke():
    """The smallest kernel there is: if this fails, Triton itself cannot run here."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=0.0) + 1.0, mask=mask)

    x = torch.zeros(5, device="cuda" if torch.cuda.is_available() else "cpu")
    try:
        add_one[(1,)](x, 5, BLOCK=8)
    except Exception as err:  # noqa: BLE001 - any failure here is an environment problem
        pytest.fail(f"Triton cannot run a trivial kernel ({type(err).__name__}: {err}). Without a GPU "
                    f"the interpreter needs TRITON_INTERPRET=1 set before triton is imported and "
                    f"a numpy that this triton supports: reinstall the pinned versions with "
                    f"`pip install -e '.[dev]'` (see pyproject.toml)")
    assert x.tolist() == [1.0] * 5


# B = 64 runs 64 kernel programs in the interpreter (5-11 s each at load ~7): the fast loop keeps the mixed batch
# (random and greedy rows in one launch); the all-random and all-greedy ones run with the slow tests.
RAGGED = [("random", 1), ("greedy", 1), ("mixed", 1), pytest.param("random", 64, marks=pytest.mark.slow),
          pytest.param("greedy", 64, marks=pytest.mark.slow), ("mixed", 64)]


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("mode, B", RAGGED)
def test_matches_reference_on_ragged_batches(mode, one_hot, B):
    seed = 100 * B + 10 * one_hot + len(mode)
    V = 77 if B == 1 else 130  # not powers of two, several BLOCK_V tiles
    batch = make_batch(seed, B, 8, V, one_hot=one_hot, placeholder_frac=0.05)
    out = assert_same(batch, greedy_flags(mode, B, seed))
    if B == 64:  # the batch really is ragged and reaches both endings
        n = (out[:, :-1] >= 0).sum(1)
        k = batch["num_draft_tokens"]
        assert k.min() == 0 and k.max() == 8
        assert bool((n < k).any()) and bool((n == k).any())


@pytest.mark.parametrize("B", [3, 17])
def test_matches_reference_with_a_seeded_generator(B):
    """Uniforms and noise drawn inside: same draws, in the same order, as the reference."""
    batch = on_device(make_batch(7, B, 5, 45), DEVICE)
    del batch["uniforms"], batch["noise"]  # drawn inside, from a CPU generator wherever the tensors are
    want = reference(**batch, generator=torch.Generator().manual_seed(3))
    got = kernel.rejection_sample_blocked(**batch, generator=torch.Generator().manual_seed(3), block_v=BLOCK_V)
    assert torch.equal(got, want)


def test_public_function_and_block_sizes_agree():
    batch = make_batch(11, 6, 4, 70)
    for block_v in (16, 64, 128):  # 128 > V: one tile
        assert_same(batch, block_v=block_v)
    batch = on_device(batch, DEVICE)
    assert torch.equal(kernel.rejection_sample(**batch), reference(**batch))


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "one_hot"])
def test_placeholder_drafts_are_rejected(one_hot):
    batch = make_batch(5, 6, 4, 40, one_hot=one_hot)
    batch["draft_token_ids"] = torch.where(torch.arange(batch["draft_token_ids"].numel()) % 2 == 0, -1,
                                           batch["draft_token_ids"])
    for greedy in (False, True):
        assert_same(batch, greedy)
    batch["draft_token_ids"] = torch.full_like(batch["draft_token_ids"], -1)  # no real draft at all
    out = assert_same(batch)
    assert bool((out[:, 0] >= 0).all()) and bool((out[:, 1:] == -1).all())


def test_q_zero_on_the_draft_token_rejects():
    batch = make_batch(6, 5, 3, 50)
    q, x = batch["draft_probs"].clone(), batch["draft_token_ids"].clamp(min=0)
    q[torch.arange(q.shape[0]), x] = 0.0
    batch["draft_probs"] = q / q.sum(-1, keepdim=True)
    batch["draft_token_ids"] = x
    batch["uniforms"] = torch.full_like(batch["uniforms"], 1e-9)  # p / q >= u holds: only q > 0 rejects
    out = assert_same(batch)
    assert bool((out[:, 1:] == -1).all())  # every first draft rejected: one recovered token each


def test_accept_test_at_the_boundary():
    """u == float64(p(x) / q(x)) (divided in float32) accepts; the next float64 above rejects."""
    V = 40
    g = torch.Generator().manual_seed(3)
    p, q = torch.rand(4, V, generator=g), torch.rand(2, V, generator=g)
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    x = (q - p[[0, 2]]).argmax(-1)  # requests 0 and 1 are verified by rows 0 and 2; p(x) < q(x)
    ratio = (p[[0, 2], x] / q[[0, 1], x]).to(torch.float64)
    assert bool((ratio < 1).all())
    for u, accepted in ((ratio, True), (torch.nextafter(ratio, torch.ones(2, dtype=torch.float64)), False)):
        batch = dict(draft_token_ids=x, num_draft_tokens=[1, 1], target_probs=p, draft_probs=q, uniforms=u,
                     noise=torch.empty(2, V).exponential_(generator=g))
        out = assert_same(batch)
        assert bool((out[:, 0] == x).all()) == accepted


def test_one_hot_target():
    batch = make_batch(8, 6, 4, 50)
    p = batch["target_probs"]
    hot = torch.randint(0, 50, (p.shape[0],), generator=torch.Generator().manual_seed(1))
    batch["target_probs"] = torch.zeros_like(p).scatter_(1, hot[:, None], 1.0)
    for greedy in (False, True):
        out = assert_same(batch, greedy)
    assert bool((out[:, 0] >= 0).all())


def test_p_equals_q_including_an_empty_residual():
    """p == q accepts every draft; a draft where q = 0 (= p) is rejected with residual 0: draw from p."""
    V, k = 40, 4
    g = torch.Generator().manual_seed(9)
    p = torch.rand(4 * (k + 1), V, generator=g) * (torch.rand(4 * (k + 1), V, generator=g) < 0.5)
    p[:, 0] += 0.5  # keep every row non-empty
    p = p / p.sum(-1, keepdim=True)
    rows = torch.arange(4 * k) + torch.arange(4).repeat_interleave(k)  # verification rows
    q = p[rows].clone()
    drafts = torch.multinomial(q, 1, generator=g).flatten()
    zero_tok = (q == 0).float().argmax(-1)  # a token with q = p = 0 in each row
    drafts[2::k] = zero_tok[2::k]  # position 2 of every request: rejected, residual all zero
    batch = dict(draft_token_ids=drafts, num_draft_tokens=[k] * 4, target_probs=p, draft_probs=q,
                 uniforms=torch.rand(4 * k, generator=g, dtype=torch.float64),
                 noise=torch.empty(4, V).exponential_(generator=g))
    out = assert_same(batch)
    assert bool((out[:, :2] == drafts.view(4, k)[:, :2]).all()) and bool((out[:, 3:] == -1).all())


def test_all_requests_without_drafts():
    batch = make_batch(4, 9, 0, 60)
    for greedy in (False, True):
        out = assert_same(batch, greedy)
        assert out.shape == (9, 1)
    empty = dict(batch, num_draft_tokens=[], target_probs=batch["target_probs"][:0],
                 noise=batch["noise"][:0], draft_probs=batch["draft_probs"][:0])
    assert kernel.rejection_sample_blocked(**on_device(empty, DEVICE)).shape == (0, 1)


def test_k_at_its_maximum_accepts_everything_when_q_is_p():
    B, k, V = 3, 8, 45
    batch = make_batch(12, B, k, V)
    batch["num_draft_tokens"] = torch.full((B,), k)
    g = torch.Generator().manual_seed(2)
    p = torch.randn(B * (k + 1), V, generator=g).softmax(-1)
    rows = torch.arange(B * k) + torch.arange(B).repeat_interleave(k)
    batch.update(target_probs=p, draft_probs=p[rows].clone(),
                 draft_token_ids=torch.multinomial(p[rows], 1, generator=g).flatten(),
                 uniforms=torch.rand(B * k, generator=g, dtype=torch.float64))
    out = assert_same(batch)
    assert bool((out >= 0).all())  # k accepted + bonus


def test_argmax_ties_pick_the_first_index_across_blocks():
    """Equal maxima in different BLOCK_V tiles and in the same tile: the first index wins."""
    V = 100
    p = torch.full((4, V), 0.1 / (V - 2))
    p[:, [40, 70]] = 0.45  # tile 1 and tile 2 of 32
    p[1, [40, 70]], p[1, [35, 38]] = 0.1 / (V - 2), 0.45  # both in tile 1
    p = p / p.sum(-1, keepdim=True)
    ones = torch.ones(4, V)  # constant noise: the race becomes an argmax, so its ties show too
    batch = dict(draft_token_ids=torch.empty(0, dtype=torch.long), num_draft_tokens=[0] * 4,
                 target_probs=p, draft_probs=torch.empty(0, V), uniforms=torch.empty(0, dtype=torch.float64),
                 noise=ones)
    for greedy in (True, False):
        out = assert_same(batch, greedy)
        assert out[:, 0].tolist() == [40, 35, 40, 40]
    # one greedy draft per request against tied rows: the draft at the second maximum is rejected
    p2 = torch.stack([p[0], p[0], p[1], p[0]])  # request r: verification row, bonus row
    batch = dict(batch, draft_token_ids=torch.tensor([70, 35]), num_draft_tokens=[1, 1], target_probs=p2,
                 draft_probs=p2[[0, 2]], uniforms=torch.tensor([0.5, 0.5], dtype=torch.float64), noise=ones[:2])
    assert assert_same(batch, greedy=True).tolist() == [[40, -1], [35, 40]]
    # uniform residuals and constant noise: every race value ties; token 0 wins
    flat = torch.full((2, V), 1.0 / V)
    batch = dict(batch, draft_token_ids=torch.tensor([-1]), num_draft_tokens=[1], target_probs=flat,
                 draft_probs=flat[:1], uniforms=torch.tensor([0.5], dtype=torch.float64), noise=ones[:1])
    assert assert_same(batch).tolist() == [[0, -1]]


def test_float64_inputs_and_strided_rows():
    batch = make_batch(13, 5, 4, 33, dtype=torch.float64)
    assert_same(batch)
    wide = torch.zeros(batch["target_probs"].shape[0], 2 * 33, dtype=torch.float64)
    wide[:, ::2] = batch["target_probs"]  # a (T + B, V) view with stride (66, 2)
    assert_same(dict(batch, target_probs=wide[:, ::2]))


def test_clear_errors():
    batch = make_batch(1, 2, 2, 20)
    with pytest.raises(ValueError, match="float32 or float64"):
        kernel.rejection_sample(**dict(batch, target_probs=batch["target_probs"].half()))
    with pytest.raises(ValueError, match="num_draft_tokens"):  # speclab.verify's own checks run
        kernel.rejection_sample(**dict(batch, num_draft_tokens=[1]))


def test_backend_selection(monkeypatch):
    assert get_rejection_sampler("torch") is reference
    monkeypatch.setenv("SPECLAB_VERIFIER", "torch")
    assert get_rejection_sampler() is reference
    assert get_rejection_sampler("triton") is kernel.rejection_sample  # the interpreter or a GPU
    if not torch.cuda.is_available():
        assert get_rejection_sampler("auto") is reference
        # on a machine with a GPU, auto picks by the tensors' device: the engine's CPU tensors take
        # the reference (the compiled kernels cannot read them), CUDA tensors the kernel
        calls = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(kernel, "RULES", dict(kernel.RULES, standard=lambda *a, **kw: calls.append(a)))
        auto = get_rejection_sampler("auto")
        assert auto.kernel is kernel.RULES["standard"] and auto.reference is reference
        batch = make_batch(2, 4, 3, 30)
        assert torch.equal(auto(**batch), reference(**batch)) and calls == []  # CPU tensors: never the kernel
        monkeypatch.undo()
        monkeypatch.setattr(kernel, "interpreted", lambda: False)
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            get_rejection_sampler("triton")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            kernel.rejection_sample(**make_batch(1, 2, 2, 20))
    monkeypatch.setenv("SPECLAB_VERIFIER", "cuda")
    with pytest.raises(ValueError, match="auto, torch, triton"):
        get_rejection_sampler()


@pytest.mark.slow  # statistical: 1200 kernel programs in the interpreter (70 s at load ~7)
def test_first_token_follows_the_target_distribution():
    """The first emitted token (accepted draft or recovered) of x ~ q is distributed as p_0.

    N = 1200 requests, 6 cells: the chi-squared test at p < 1e-4 detects (power 0.99) any
    TV distance >= min_detectable_tv(1200, 6) ~= 0.10. Negative control: the same counts tested
    against q_0 (TV(p_0, q_0) = 0.55) must fail, so the test has the power it claims.
    """
    N, V = 1200, 6
    p = torch.tensor([[0.30, 0.05, 0.25, 0.10, 0.20, 0.10], [0.1] * 5 + [0.5]])  # p_0, bonus row
    q = torch.tensor([[0.05, 0.40, 0.05, 0.30, 0.10, 0.10]])
    g = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q, N, replacement=True, generator=g).flatten()  # (N,) x ~ q_0
    out = kernel.rejection_sample_blocked(drafts.to(DEVICE), [1] * N, p.repeat(N, 1).to(DEVICE),
                                          q.repeat(N, 1).to(DEVICE), generator=g, block_v=8)
    counts = np.bincount(out[:, 0].cpu().numpy(), minlength=V)
    assert min_detectable_tv(N, V) < 0.11 < tv_distance(p[0], q[0])
    assert chi2_gof(counts, p[0].numpy()) >= 1e-4, f"first tokens {counts} do not follow p_0 = {p[0].tolist()}"
    assert chi2_gof(counts, q[0].numpy()) < 1e-4  # negative control


@pytest.mark.gpu
@pytest.mark.parametrize("V", [32000, 128256])
def test_matches_reference_on_gpu(V):
    batch = make_batch(21, 64, 5, V, placeholder_frac=0.05)
    batch = {name: t.cuda() if torch.is_tensor(t) else t for name, t in batch.items()}
    for one_hot in (False, True):
        b = dict(batch, draft_probs=None) if one_hot else batch
        for greedy in (False, True, greedy_flags("mixed", 64, 0).cuda()):
            assert torch.equal(kernel.rejection_sample(**b, greedy=greedy), reference(**b, greedy=greedy))
    auto = get_rejection_sampler("auto")  # the kernel for CUDA tensors, the reference for CPU ones
    assert auto.kernel is kernel.rejection_sample and auto.reference is reference
    assert torch.equal(auto(**batch), kernel.rejection_sample(**batch))
