"""Lesson 10: the Triton block-verification kernel equals the torch rule (speclab/verify/block.py) bit for bit.

As in lesson 07's kernel tests: without a GPU the kernels run in Triton's CPU interpreter
(conftest.py sets TRITON_INTERPRET=1), so batches and vocabularies stay small and a small BLOCK_V
makes the multi-tile paths (the residual mass Z summed tile by tile, the running argmax of the
race, the masked tail) run anyway; with a GPU every check runs there (batches moved to DEVICE).
The torch rule itself is tested for its law in test_10_block.py.
"""

import pytest
import torch

from speclab.kernels import rejection_sample as kernel
from speclab.verify import block
from speclab.verify.backend import get_rejection_sampler
from speclab.verify.rejection import rejection_sample as standard
from tests.helpers import on_device

BLOCK_V = 16
DEVICE = "cpu" if kernel.interpreted() else "cuda"  # compiled kernels read GPU memory only


def make_batch(seed, B, max_k, V, *, one_hot=False, placeholder_frac=0.0, dtype=torch.float32):
    """A seeded ragged batch, k_r ~ U{0..max_k}; q is p's logits plus noise, so that long kept
    blocks, rejections and bonus tokens all happen; half the drafts are p's argmax (greedy rows)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(0, max_k + 1, (B,), generator=g)
    T = int(k.sum())
    logits = 1.5 * torch.randn(T + B, V, generator=g, dtype=torch.float64)
    p = logits.softmax(-1)  # (T + B, V)
    verify_rows = torch.arange(T) + torch.repeat_interleave(torch.arange(B), k)  # (T,)
    q = (logits[verify_rows] + torch.randn(T, V, generator=g, dtype=torch.float64)).softmax(-1)  # (T, V)
    drafts = torch.multinomial(q, 1, generator=g).flatten() if T else torch.empty(0, dtype=torch.long)
    drafts = torch.where(torch.rand(T, generator=g) < 0.5, p[verify_rows].argmax(-1), drafts)
    drafts = torch.where(torch.rand(T, generator=g) < placeholder_frac, -1, drafts)
    return dict(draft_token_ids=drafts, num_draft_tokens=k, target_probs=p.to(dtype),
                draft_probs=None if one_hot else q.to(dtype),
                uniforms=torch.rand(T, generator=g, dtype=torch.float64).clamp(min=1e-300),
                noise=torch.empty(B, V, dtype=dtype).exponential_(generator=g).clamp(min=1e-30))


def assert_same(batch, greedy=False, block_v=BLOCK_V):
    """The kernel and the torch rule on DEVICE, bit for bit; returns the tokens on the CPU."""
    batch, greedy = on_device(batch, DEVICE), on_device(greedy, DEVICE)
    want = block.rejection_sample(**batch, greedy=greedy)
    got = kernel.rejection_sample_block(**batch, greedy=greedy, block_v=block_v)
    assert got.dtype == torch.int64 and got.shape == want.shape and got.device == want.device
    assert torch.equal(got, want), f"kernel\n{got}\n!= torch block rule\n{want}"
    return got.cpu()


def greedy_flags(mode, B, seed):
    if mode == "mixed":
        return torch.rand(B, generator=torch.Generator().manual_seed(seed + 1)) < 0.5
    return mode == "greedy"


@pytest.mark.parametrize("B", [1, 24])
@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("mode", ["random", "greedy", "mixed"])
def test_matches_the_torch_rule_on_ragged_batches(mode, one_hot, B):
    seed = 100 * B + 10 * one_hot + len(mode)
    V = 37 if B == 1 else 41  # not powers of two, several BLOCK_V tiles
    batch = make_batch(seed, B, 8, V, one_hot=one_hot, placeholder_frac=0.05)
    out = assert_same(batch, greedy_flags(mode, B, seed))
    if B == 24 and mode == "random":  # both endings, and a block kept past a failed test
        n = (out[:, :-1] >= 0).sum(1)
        k = batch["num_draft_tokens"]
        assert bool((n < k).any()) and bool((n == k).any())
        if not one_hot:
            standard = kernel.rejection_sample(**on_device(batch, DEVICE)).cpu()
            assert bool(((standard[:, :-1] >= 0).sum(1) < n).any()), "block kept more drafts somewhere"


def test_float64_inputs():
    assert_same(make_batch(3, 12, 6, 29, dtype=torch.float64))


@pytest.mark.parametrize("B", [3, 17])
def test_matches_with_a_seeded_generator(B):
    """Uniforms and noise drawn inside: the same draws, in the same order, as the torch rule."""
    batch = on_device(make_batch(7, B, 5, 45), DEVICE)
    del batch["uniforms"], batch["noise"]  # drawn inside, from a CPU generator wherever the tensors are
    want = block.rejection_sample(**batch, generator=torch.Generator().manual_seed(3))
    got = kernel.rejection_sample_block(**batch, generator=torch.Generator().manual_seed(3), block_v=BLOCK_V)
    assert torch.equal(got, want)


def test_block_sizes_agree():
    batch = make_batch(11, 6, 4, 70)
    for block_v in (8, 64, 128):  # 128 > V: one tile
        assert_same(batch, block_v=block_v)


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "one_hot"])
def test_placeholders_and_k_zero(one_hot):
    batch = make_batch(5, 8, 5, 23, one_hot=one_hot)
    batch["draft_token_ids"] = torch.where(torch.arange(batch["draft_token_ids"].numel()) % 3 == 1, -1,
                                           batch["draft_token_ids"])
    assert_same(batch)
    batch["draft_token_ids"] = torch.full_like(batch["draft_token_ids"], -1)  # no real draft at all
    out = assert_same(batch)
    assert (out[:, 1:] == -1).all()
    zero = make_batch(6, 5, 0, 23, one_hot=one_hot)
    assert int(zero["num_draft_tokens"].sum()) == 0
    assert assert_same(zero).shape == (5, 1)


def test_registered_for_the_backend():
    assert kernel.RULES["block"] is kernel.rejection_sample_block
    if not kernel.interpreted() and not torch.cuda.is_available():
        pytest.skip("no GPU and no Triton interpreter")
    assert get_rejection_sampler("triton", method="block") is kernel.rejection_sample_block
    assert get_rejection_sampler("torch", method="block") is block.rejection_sample


def test_the_standard_kernel_is_unchanged_by_the_block_kernel():
    """The standard rule's kernels still answer for "standard" (a different rule: they differ somewhere)."""
    batch = on_device(make_batch(9, 24, 8, 41), DEVICE)
    assert torch.equal(kernel.RULES["standard"](**batch), standard(**batch))
    assert not torch.equal(kernel.RULES["standard"](**batch), kernel.rejection_sample_block(**batch))


@pytest.mark.gpu
def test_matches_on_a_gpu():
    """On a GPU the kernels compile for real (no interpreter): still bit for bit."""
    batch = make_batch(21, 256, 8, 5003)
    cuda = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in batch.items()}
    for greedy in (False, True, greedy_flags("mixed", 256, 21).cuda()):
        want = block.rejection_sample(**cuda, greedy=greedy)
        got = kernel.rejection_sample_block(**cuda, greedy=greedy)
        assert torch.equal(got, want)
