"""Grades exercise 05 (paged KV over non-contiguous block tables). `pytest --impl=exercises tests/test_ex05_paged_kv.py`.

Block tables here are random, non-contiguous lists of block ids, as in a fragmented pool; rollback may
free blocks in any order. Negative controls at the bottom grade the grader (skipped under --impl=exercises).
"""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speclab.kv_cache import KVCacheManager
from tests.helpers import fail_on

EXERCISE = "ex05_paged_kv"
pytestmark = pytest.mark.exercise


def random_tables(rng, block_size, lengths, num_blocks=64):
    """Non-contiguous tables for requests of the given lengths, from one shuffled pool."""
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    tables = []
    for n in lengths:
        need = math.ceil(n / block_size)
        tables.append(pool[:need])
        pool = pool[need:]
    return tables


def check_blocks_to_allocate(fn):
    cases = [((0, 0, 10, 0, 4), 3, "a 10-token prefill needs ceil(10 / 4) blocks"),
             ((3, 10, 5, 0, 4), 1, "10 cached + 1 + k = 5 new tokens need ceil(15 / 4) = 4 blocks; 3 are held"),
             ((3, 10, 5, 4, 4), 2, "with 4 lookahead slots for a drafter, ceil(19 / 4) = 5 blocks; 3 are held"),
             ((5, 12, 1, 0, 4), 0, "13 tokens fit in the 5 blocks held (blocks kept lazily): nothing new, never negative"),
             ((0, 0, 1, 0, 1), 1, "block_size 1: one block per token")]
    for args, want, why in cases:
        got = fn(*args)
        if got != want:
            return (f"blocks_to_allocate(held, computed, new, lookahead, block_size) = blocks_to_allocate{args} "
                    f"should be {want}: {why}; got {got}")
    return None


def check_slot_mapping(fn, seed):
    rng = random.Random(seed)
    bs = rng.randint(1, 8)
    B = rng.randint(1, 5)
    computed = [rng.randint(0, 20) for _ in range(B)]
    new = [rng.randint(0, 6) for _ in range(B)]
    tables = random_tables(rng, bs, [c + n for c, n in zip(computed, new)], num_blocks=200)
    kv = KVCacheManager(200, bs)
    want = []
    for r, table in enumerate(tables):
        kv.block_tables[str(r)] = table
        want += kv.slot_mapping(str(r), computed[r], new[r])
    got = fn(tables, bs, computed, new)
    if got == want:
        return None
    if len(got) != len(want):
        return (f"one slot per new token of every request, request after request: want {len(want)} slots "
                f"(num_new_tokens {new}), got {len(got)}")
    i = next(j for j in range(len(want)) if got[j] != want[j])
    r = next(r for r in range(B) if i < sum(new[:r + 1]))
    t = computed[r] + i - sum(new[:r])
    return (f"block_size {bs}, request {r} with table {tables[r]}: position {t} lives in block "
            f"table[{t} // {bs}] = {tables[r][t // bs]}, offset {t % bs}, so slot {want[i]}; got {got[i]} "
            f"(flat index {i}). Each request's new positions start at its num_computed_tokens and go through its own "
            f"table, whose block ids need not be consecutive")


def check_gather(fn, seed):
    rng = random.Random(seed)
    bs, H, D = rng.randint(1, 6), 2, 3
    num_blocks = 40
    seq_len = rng.randint(0, 30)
    table = random_tables(rng, bs, [seq_len + rng.randint(0, 2 * bs)], num_blocks=num_blocks)[0]  # maybe spare blocks
    cache = torch.full((num_blocks, bs, H, D), float("nan"))
    truth = torch.randn(seq_len, H, D, generator=torch.Generator().manual_seed(seed))
    for t in range(seq_len):
        cache[table[t // bs], t % bs] = truth[t]
    got = fn(cache, table, seq_len)
    if tuple(got.shape) != (seq_len, H, D):
        return f"gather_kv returns (seq_len, H, D) = {(seq_len, H, D)}, got {tuple(got.shape)}"
    bad = [t for t in range(seq_len) if not torch.equal(got[t], truth[t])]
    if bad:
        t = bad[0]
        return (f"block_size {bs}, table {table}, seq_len {seq_len}: position {t} is in block {table[t // bs]} at "
                f"offset {t % bs}; your row {t} holds something else (reading past seq_len, or assuming the "
                f"blocks are contiguous, returns the wrong vectors)")
    return None


def check_rollback(fn, seed):
    rng = random.Random(seed)
    bs = rng.randint(1, 8)
    total = rng.randint(1, 60)
    keep_tokens = rng.randint(0, total)
    table = random_tables(rng, bs, [total])[0]
    kept, freed = fn(list(table), bs, keep_tokens)
    keep = math.ceil(keep_tokens / bs)
    if kept != table[:keep]:
        return (f"block_size {bs}, table {table}: keeping {keep_tokens} tokens needs ceil({keep_tokens} / {bs}) = "
                f"{keep} blocks, the table's first {keep} in order: {table[:keep]}; got {kept}")
    if sorted(freed) != sorted(table[keep:]):
        return (f"block_size {bs}, table {table}, keeping {keep_tokens} tokens: every block past the first {keep} "
                f"goes back to the pool, each once (any order): {table[keep:]}; got {freed}")
    return None


def check_num_computed(fn):
    cases = [((15, 4, 4), 15, "all 4 drafts accepted: nothing rolls back"),
             ((15, 4, 1), 12, "3 of 4 drafts rejected: 15 - 3"),
             ((11, 0, 0), 11, "plain decoding (k = 0): nothing to roll back"),
             ((20, 5, 0), 15, "every draft rejected: back by 5; the recovered token is fed next step")]
    for args, want, why in cases:
        got = fn(*args)
        if got != want:
            return (f"num_computed_tokens was already advanced by 1 + k when the step was scheduled; "
                    f"num_computed_after_verification{args} should be {want} ({why}); got {got}")
    return None


def test_blocks_to_allocate(impl):
    fail_on(check_blocks_to_allocate(impl.blocks_to_allocate))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10 ** 6))
def test_slot_mapping_batch_over_scattered_tables(impl, seed):
    fail_on(check_slot_mapping(impl.slot_mapping_batch, seed))


def test_slot_mapping_by_hand(impl):
    got = impl.slot_mapping_batch([[7, 2, 9], [4]], 4, [2, 1], [7, 2])
    want = [30, 31, 8, 9, 10, 11, 36, 17, 18]
    if got != want:
        pytest.fail(f"tables [7, 2, 9] and [4], block_size 4: request 0 positions 2..8 -> {want[:7]}, request 1 "
                    f"positions 1..2 -> {want[7:]}; got {got}", pytrace=False)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10 ** 6))
def test_gather_kv(impl, seed):
    fail_on(check_gather(impl.gather_kv, seed))


def test_num_computed_after_verification(impl):
    fail_on(check_num_computed(impl.num_computed_after_verification))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10 ** 6))
def test_rollback_any_free_order(impl, seed):
    fail_on(check_rollback(impl.rollback, seed))


def test_rollback_returns_every_block_to_the_pool(impl):
    """Three requests share a shuffled pool; after rollbacks and re-allocations no block is lost or owned twice."""
    rng = random.Random(3)
    bs, pool = 4, list(range(30))
    rng.shuffle(pool)
    tables = {}
    for rid, n in (("A", 13), ("B", 22), ("C", 7)):
        need = math.ceil(n / bs)
        tables[rid], pool = pool[:need], pool[need:]
    for rid, keep in (("A", 9), ("B", 4), ("C", 0)):
        tables[rid], freed = impl.rollback(tables[rid], bs, keep)
        pool += list(freed)
    owned = [b for t in tables.values() for b in t]
    if sorted(owned + pool) != list(range(30)):
        pytest.fail(f"after rolling back A to 9, B to 4 and C to 0 tokens, owned {sorted(owned)} + free {sorted(pool)} "
                    f"must be each of the 30 blocks exactly once", pytrace=False)


# ---------------------------------------------------------------------------------------------
# Negative (and one positive) controls


def slots_assume_contiguous(block_tables, block_size, num_computed_tokens, num_new_tokens):
    """BUG: position t at table[0] * bs + t, as if the request's blocks were consecutive."""
    return [table[0] * block_size + t for table, s, n in zip(block_tables, num_computed_tokens, num_new_tokens)
            for t in range(s, s + n)]


def slots_restart_per_batch(block_tables, block_size, num_computed_tokens, num_new_tokens):
    """BUG: positions counted from 0 for each request's new tokens (forgets num_computed)."""
    return [table[t // block_size] * block_size + t % block_size
            for table, n in zip(block_tables, num_new_tokens) for t in range(n)]


def gather_contiguous(kv_cache, block_table, seq_len):
    """BUG: reads seq_len slots starting at the first block."""
    flat = kv_cache.reshape(-1, *kv_cache.shape[2:])
    start = block_table[0] * kv_cache.shape[1] if block_table else 0
    return flat[start:start + seq_len]


def rollback_floor(block_table, block_size, num_tokens):
    """BUG: floor instead of ceil drops the block holding the last partial tokens."""
    keep = num_tokens // block_size
    return block_table[:keep], block_table[keep:]


def rollback_tail_first(block_table, block_size, num_tokens):
    """Correct, freeing tail-first as vLLM does: must pass."""
    keep = math.ceil(num_tokens / block_size)
    return block_table[:keep], block_table[keep:][::-1]


def allocate_without_lookahead(held, computed, new, lookahead, block_size):
    """BUG: forgets the drafter's lookahead slots."""
    return max(0, math.ceil((computed + new) / block_size) - held)


def keeps_every_draft(num_computed_tokens, num_draft_tokens, num_accepted):
    """BUG: the counter is not moved back."""
    return num_computed_tokens


def first_failure(check, fn):
    return next((m for seed in range(40) if (m := check(fn, seed))), None)


@pytest.mark.parametrize("fn", [slots_assume_contiguous, slots_restart_per_batch], ids=lambda f: f.__name__)
def test_control_slot_check_catches(controls, fn):
    message = first_failure(check_slot_mapping, fn)
    assert message is not None
    print(message)


def test_control_gather_check_catches(controls):
    message = first_failure(check_gather, gather_contiguous)
    assert message is not None
    print(message)


def test_control_rollback_check(controls):
    message = first_failure(check_rollback, rollback_floor)
    assert message is not None
    print(message)
    assert first_failure(check_rollback, rollback_tail_first) is None, "tail-first freeing is correct and must pass"


def test_control_counter_checks(controls):
    for check, fn in ((check_blocks_to_allocate, allocate_without_lookahead), (check_num_computed, keeps_every_draft)):
        message = check(fn)
        assert message is not None
        print(message)
