"""The paged CPU attention kernel (speclab.models.cpu_attention): the attention it claims, read
through scattered block tables; the same bits for a token whatever else is in the forward; the
causal limit; bfloat16 caches read as they are; a clear error for a table that does not hold a
token's slots; and the torch path wherever the kernel does not apply."""

import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch

from speclab.models import cpu_attention, llama
from speclab.models.llama import AttentionMetadata

needs_kernel = pytest.mark.skipif(not cpu_attention.available(),
                                  reason=f"kernel not built: {cpu_attention.why_unavailable()}")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def ragged(new, lens, H=9, Hkv=3, Dh=64, block_size=16, seed=0):
    """q, caches and metadata of a causal batch: request b brings new[b] tokens, ending at lens[b];
    its blocks are scattered over the pool in random order."""
    g = torch.Generator().manual_seed(seed)
    nb = sum(math.ceil(n / block_size) for n in lens) + 3
    k_cache, v_cache = torch.randn(nb, block_size, Hkv, Dh, generator=g), torch.randn(nb, block_size, Hkv, Dh, generator=g)
    perm = torch.randperm(nb, generator=g).tolist()
    tables, positions, starts, used = [], [], [0], 0
    for q, n in zip(new, lens):
        blocks = math.ceil(n / block_size)
        tables.append(perm[used:used + blocks])
        used += blocks
        positions += range(n - q, n)
        starts.append(starts[-1] + q)
    width = max(map(len, tables))
    meta = AttentionMetadata(positions=torch.tensor(positions), slot_mapping=torch.zeros(len(positions), dtype=torch.long),
                             query_start_loc=starts, seq_lens=list(lens),
                             block_tables=torch.tensor([t + [-1] * (width - len(t)) for t in tables]))
    q = torch.randn(len(positions), H + Hkv, Dh, generator=g)[:, :H]  # a view into a fused qkv, as the model passes it
    return q, k_cache, v_cache, meta


def reference(q, k_cache, v_cache, meta):
    """Float64 attention of each token over its request's slots 0..t, one token at a time."""
    H, (_, block_size, Hkv, Dh) = q.shape[1], k_cache.shape
    out = torch.empty(q.shape, dtype=torch.float64)
    for b in range(len(meta.seq_lens)):
        table = meta.block_tables[b]
        for i in range(meta.query_start_loc[b], meta.query_start_loc[b + 1]):
            n = int(meta.positions[i]) + 1
            slots = [int(table[s // block_size]) * block_size + s % block_size for s in range(n)]
            keys = k_cache.reshape(-1, Hkv, Dh)[slots].double().repeat_interleave(H // Hkv, 1)    # (n, H, Dh)
            values = v_cache.reshape(-1, Hkv, Dh)[slots].double().repeat_interleave(H // Hkv, 1)
            weights = torch.softmax(torch.einsum("hd,nhd->hn", q[i].double(), keys) / math.sqrt(Dh), -1)
            out[i] = torch.einsum("hn,nhd->hd", weights, values)
    return out


def kernel(q, k_cache, v_cache, meta):
    assert cpu_attention.applies(q, k_cache)
    return cpu_attention.paged_attention(q, k_cache, v_cache, *meta.kernel_tables)


CASES = {
    "decode batch": ([1] * 5, [1, 17, 40, 100, 233]),
    "verify steps": ([5, 3, 9], [21, 64, 130]),
    "prefills": ([37, 64, 1], [37, 64, 1]),
    "mixed (chunked prefill beside decode and verify)": ([20, 1, 5], [52, 90, 6]),
}


@needs_kernel
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("heads,dh,block_size", [((9, 3), 64, 16), ((4, 4), 8, 1), ((8, 2), 128, 5), ((6, 1), 24, 32)])
def test_kernel_matches_float64_attention_through_scattered_blocks(case, heads, dh, block_size):
    """Grouped and plain heads, head_dim 8-128, blocks of 1-32 slots (partial last blocks)."""
    new, lens = CASES[case]
    q, kc, vc, meta = ragged(new, lens, *heads, dh, block_size, seed=len(case) + dh)
    torch.testing.assert_close(kernel(q, kc, vc, meta).double(), reference(q, kc, vc, meta), rtol=1e-5, atol=2e-6)


@needs_kernel
@pytest.mark.parametrize("case", CASES)
def test_bfloat16_caches_are_read_as_they_are(case):
    """bf16 q and caches: the float64 attention of those very bf16 values, within the one rounding
    of the output to bf16 (2^-8 relative), and torch.equal to the float32 kernel on the widened
    values rounded once: the kernel widens exactly and then does the float32 arithmetic."""
    new, lens = CASES[case]
    q, kc, vc, meta = ragged(new, lens, seed=len(case))
    q, kc, vc = q.bfloat16(), kc.bfloat16(), vc.bfloat16()
    out = kernel(q, kc, vc, meta)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference(q, kc, vc, meta), rtol=2 ** -8, atol=1e-3)
    assert torch.equal(out, kernel(q.float(), kc.float(), vc.float(), meta).bfloat16())


@needs_kernel
def test_a_bfloat16_token_s_attention_has_the_same_bits_alone_and_in_a_verify_step():
    """What keeps bf16 greedy speculation exact: a token's attention alone (a decode step) and as
    the last of a 5-token verify step beside another request, torch.equal."""
    q, kc, vc, meta = ragged([5, 1], [100, 300])
    q, kc, vc = q.bfloat16(), kc.bfloat16(), vc.bfloat16()
    big = kernel(q, kc, vc, meta)
    alone = AttentionMetadata(positions=meta.positions[4:5], slot_mapping=meta.slot_mapping[4:5],
                              query_start_loc=[0, 1], seq_lens=[100], block_tables=meta.block_tables[:1])
    assert torch.equal(kernel(q[4:5], kc, vc, alone), big[4:5])


@needs_kernel
def test_mixed_dtypes_are_refused_with_the_fix():
    q, kc, vc, meta = ragged([1], [20])
    assert not cpu_attention.applies(q, kc.bfloat16())
    with pytest.raises(ValueError, match="share one dtype"):
        cpu_attention.paged_attention(q, kc.bfloat16(), vc.bfloat16(), *meta.kernel_tables)


@needs_kernel
def test_the_torch_path_agrees(monkeypatch):
    """The kernel and the gather + SDPA path compute the same attention (different rounding)."""
    q, kc, vc, meta = ragged([1, 5, 30], [80, 200, 30])
    ours = kernel(q, kc, vc, meta)
    monkeypatch.setattr(cpu_attention, "applies", lambda *args: False)
    with_torch = llama.paged_attention(q, kc, vc, dataclasses.replace(meta, _shared={}))
    torch.testing.assert_close(ours, with_torch, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_token_s_attention_has_the_same_bits_alone_and_in_any_batch():
    """Token at position 99 of request 0: alone in a decode step, last of a 5-token verify step,
    inside a 100-token prefill, and beside other requests: torch.equal, not close."""
    q, kc, vc, meta = ragged([100, 5, 1], [100, 60, 300])
    big = kernel(q, kc, vc, meta)
    table = meta.block_tables[:1, :7]
    for first in (99, 95, 0):   # decode step, verify step, the prompt's whole prefill
        alone = AttentionMetadata(positions=meta.positions[first:100], slot_mapping=meta.slot_mapping[first:100],
                                  query_start_loc=[0, 100 - first], seq_lens=[100], block_tables=table)
        out = kernel(q[first:100], kc, vc, alone)
        assert torch.equal(out, big[first:100]), f"tokens {first}..99 alone differ from the batch"


@needs_kernel
def test_a_token_never_reads_slots_after_its_position():
    """Slots after a token's position (the rest of a verify chunk, stale entries in the last
    block) can hold anything, NaN included, without changing its output by a bit."""
    q, kc, vc, meta = ragged([5], [40])
    before = kernel(q, kc, vc, meta)
    block = int(meta.block_tables[0, 2])     # slots 32..47: the chunk is 35..39, 40..47 unused
    kc2, vc2 = kc.clone(), vc.clone()
    kc2[block, 8:], vc2[block, 8:] = float("nan"), float("nan")
    assert torch.equal(kernel(q, kc2, vc2, meta), before)
    kc2[block, 4], vc2[block, 4] = 1e3, 1e3  # slot 36: token 35 does not see it, 36..39 do
    after = kernel(q, kc2, vc2, meta)
    assert torch.equal(after[0], before[0]) and not torch.equal(after[1:], before[1:])


@needs_kernel
def test_extreme_scores_stay_finite_and_right():
    """Scores hundreds apart (weights below float's range become 0) and equal scores (uniform)."""
    q, kc, vc, meta = ragged([3], [50], Dh=64)
    q = q * 40.0
    torch.testing.assert_close(kernel(q, kc, vc, meta).double(), reference(q, kc, vc, meta), rtol=1e-5, atol=1e-5)
    q0 = torch.zeros_like(q)
    out = kernel(q0, kc, vc, meta)            # all scores 0: the mean of the values seen
    torch.testing.assert_close(out.double(), reference(q0, kc, vc, meta), rtol=1e-5, atol=1e-6)


@needs_kernel
def test_a_table_without_a_token_s_blocks_is_refused_with_the_cause():
    q, kc, vc, meta = ragged([1, 1], [40, 10])
    meta.block_tables[1, 0] = -1               # request 1's only block, as padding
    with pytest.raises(ValueError, match="block table does not hold"):
        kernel(q, kc, vc, meta)
    q, kc, vc, meta = ragged([1], [40])
    meta.block_tables[0, 1] = kc.shape[0]      # an id past the pool
    with pytest.raises(ValueError, match="outside the pool"):
        kernel(q, kc, vc, meta)


def test_the_torch_path_takes_what_the_kernel_does_not(monkeypatch):
    """float16, more than one thread, head_dim 12: `applies` is False (and the model's attention
    still runs, through gather + SDPA, a tree's mask included)."""
    q, kc, vc, meta = ragged([3], [20])
    assert not cpu_attention.applies(q.half(), kc.half())
    torch.set_num_threads(2)
    assert not cpu_attention.applies(q, kc)
    torch.set_num_threads(1)
    assert not cpu_attention.applies(torch.randn(3, 9, 12), torch.randn(4, 16, 3, 12))  # head_dim 12
    tree = [(17, torch.tensor([[True, False, False], [True, True, False], [True, False, True]]))]
    monkeypatch.setattr(cpu_attention, "applies", lambda *args: False)
    tree_meta = dataclasses.replace(meta, _shared={}, tree_masks=tree)
    assert llama.paged_attention(q, kc, vc, tree_meta).shape == q.shape


# A tree of drafts (lesson 10): root r, children a, b, c of r, grandchild d of a; slots base..base+4
# in that order, each node at the position of its depth.
TREE_PARENTS = [-1, 0, 0, 0, 1]


def tree_case(committed=37, other=(5, 60), seed=0):
    """A batch of a causal verify request beside a tree request (committed slots, then the 5 nodes):
    q, caches, the tree metadata, and each node's ancestors (itself included) as node indices."""
    n = len(TREE_PARENTS)
    q, kc, vc, meta = ragged([other[0], n], [other[1], committed + n], seed=seed)
    lines = []
    for i, p in enumerate(TREE_PARENTS):
        lines.append(([] if p < 0 else lines[p]) + [i])
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, line in enumerate(lines):
        mask[i, line] = True
    positions = meta.positions.clone()
    positions[other[0]:] = torch.tensor([committed + len(line) - 1 for line in lines])
    meta = dataclasses.replace(meta, positions=positions, tree_masks=[None, (committed, mask)], _shared={})
    return q, kc, vc, meta, lines


def tree_reference(q, k_cache, v_cache, meta, lines, first, committed):
    """Float64: each tree node over the committed slots and its ancestors' slots, nothing else."""
    H, (_, block_size, Hkv, Dh) = q.shape[1], k_cache.shape
    table = meta.block_tables[1]
    out = torch.empty(len(lines), H, Dh, dtype=torch.float64)
    for i, line in enumerate(lines):
        slots = [int(table[s // block_size]) * block_size + s % block_size
                 for s in list(range(committed)) + [committed + j for j in line]]
        keys = k_cache.reshape(-1, Hkv, Dh)[slots].double().repeat_interleave(H // Hkv, 1)
        values = v_cache.reshape(-1, Hkv, Dh)[slots].double().repeat_interleave(H // Hkv, 1)
        weights = torch.softmax(torch.einsum("hd,nhd->hn", q[first + i].double(), keys) / math.sqrt(Dh), -1)
        out[i] = torch.einsum("hn,nhd->hd", weights, values)
    return out


@needs_kernel
def test_a_tree_s_nodes_see_the_committed_past_and_their_ancestors_only(monkeypatch):
    """Against float64 per node, against the torch path's mask, and the causal request beside the
    tree is untouched by it."""
    q, kc, vc, meta, lines = tree_case()
    ours = kernel(q, kc, vc, meta)
    torch.testing.assert_close(ours[5:].double(), tree_reference(q, kc, vc, meta, lines, 5, 37), rtol=1e-5, atol=2e-6)
    causal = dataclasses.replace(meta, tree_masks=None, _shared={})
    assert torch.equal(ours[:5], kernel(q, kc, vc, causal)[:5])
    monkeypatch.setattr(cpu_attention, "applies", lambda *args: False)
    torch.testing.assert_close(ours, llama.paged_attention(q, kc, vc, dataclasses.replace(meta, _shared={})),
                               rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_tree_node_has_the_bits_of_the_same_token_in_a_chain():
    """Node d (ancestors r, a) against a causal chain r, a, d written in consecutive slots: the
    unseen siblings' weights are exactly 0, so torch.equal, not close (what keeps greedy tree
    speculation's tokens those of plain decoding)."""
    q, kc, vc, meta, lines = tree_case()
    tree_out = kernel(q, kc, vc, meta)
    table = meta.block_tables[1]
    slot = lambda s: (int(table[s // 16]), s % 16)
    kc2, vc2 = kc.clone(), vc.clone()
    for j, node in enumerate(lines[4]):  # r, a, d into slots 37, 38, 39
        (b0, o0), (b1, o1) = slot(37 + j), slot(37 + node)
        kc2[b0, o0], vc2[b0, o0] = kc[b1, o1], vc[b1, o1]
    chain = AttentionMetadata(positions=torch.tensor([39]), slot_mapping=torch.zeros(1, dtype=torch.long),
                              query_start_loc=[0, 1], seq_lens=[40], block_tables=meta.block_tables[1:2])
    assert torch.equal(kernel(q[9:10], kc2, vc2, chain), tree_out[9:10])


@needs_kernel
def test_a_tree_mask_of_the_wrong_shape_is_refused_with_the_cause():
    q, kc, vc, meta, _ = tree_case()
    bad = dataclasses.replace(meta, tree_masks=[None, (37, torch.ones(5, 4, dtype=torch.bool))], _shared={})
    with pytest.raises(ValueError, match="tree mask is"):
        kernel(q, kc, vc, bad)


def test_the_switch_turns_the_kernel_off(tmp_path):
    script = "from speclab.models import cpu_attention; print('available', cpu_attention.available(), cpu_attention.why_unavailable())"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SPECLAB_CACHE": str(tmp_path), "SPECLAB_CPU_ATTENTION": "0"}).stdout
    assert "available False SPECLAB_CPU_ATTENTION=0" in out, out
