"""Property-based tests of the paged KV cache's bookkeeping (hypothesis).

Random sequences of allocate / append / rollback / free over several requests must keep:
free + used = total blocks; no block owned twice; a table of ceil(tokens / block_size) blocks
after each rollback; and a cache whose contents, read back through the block table, equal what a
fresh computation of the surviving tokens would have written.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speclab.kv_cache import KVCacheManager, NoFreeBlocksError


def check_invariants(kv: KVCacheManager, total: int):
    owned = [b for table in kv.block_tables.values() for b in table]
    assert len(owned) == len(set(owned)), "a block is owned twice"
    assert set(owned).isdisjoint(kv.pool.free_queue), "a block is both owned and free"
    assert len(owned) + kv.num_free_blocks == total, "blocks leaked or duplicated"
    assert all(0 <= b < total for b in owned)


ops = st.lists(st.tuples(st.sampled_from(["step", "free"]), st.integers(0, 3),  # request
                         st.integers(1, 9), st.integers(0, 9)),  # k + 1 new tokens, accepted (clipped)
               min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops=ops, block_size=st.sampled_from([1, 2, 4, 16]), num_blocks=st.integers(4, 40))
def test_speculative_steps_keep_the_invariants_and_the_contents(ops, block_size, num_blocks):
    """Each 'step' writes n new tokens (1 + k drafts), then keeps 1 + accepted of them, as the engine does."""
    kv = KVCacheManager(num_blocks, block_size)
    cache = torch.full((num_blocks * block_size,), -1, dtype=torch.long)  # one slot = one token's "KV"
    tokens: dict[str, list[int]] = {}
    next_token = 0
    for op, r, n, accepted in ops:
        rid = f"r{r}"
        if op == "free":
            kv.free(rid)
            tokens.pop(rid, None)
        else:
            seq = tokens.setdefault(rid, [])
            try:
                kv.allocate(rid, len(seq), n)
            except NoFreeBlocksError:
                assert len(kv.block_tables.get(rid, [])) == math.ceil(len(seq) / block_size)  # unchanged
                check_invariants(kv, num_blocks)  # a refused allocation changes nothing
                continue
            new = list(range(next_token, next_token + n))
            next_token += n
            cache[kv.slot_mapping(rid, len(seq), n)] = torch.tensor(new)  # write k + 1 slots
            keep = min(1 + accepted, n)
            seq += new[:keep]
            kv.rollback(rid, len(seq))  # the rejected tail goes away
            assert len(kv.block_tables[rid]) == math.ceil(len(seq) / block_size)
            # what the cache holds for this request, read back through its table, is its surviving tokens
            assert cache[kv.slot_mapping(rid, 0, len(seq))].tolist() == seq
        check_invariants(kv, num_blocks)
    for rid in list(kv.block_tables):
        kv.free(rid)
    assert kv.num_free_blocks == num_blocks


@settings(max_examples=100, deadline=None)
@given(num_tokens=st.integers(0, 200), block_size=st.integers(1, 32), lookahead=st.integers(0, 8))
def test_allocate_covers_new_and_lookahead_slots(num_tokens, block_size, lookahead):
    kv = KVCacheManager(64, block_size)
    try:
        kv.allocate("a", 0, num_tokens, lookahead)
    except NoFreeBlocksError:
        assert math.ceil((num_tokens + lookahead) / block_size) > 64
        assert kv.num_free_blocks == 64
        return
    assert len(kv.block_tables["a"]) == math.ceil((num_tokens + lookahead) / block_size)
    slots = kv.slot_mapping("a", 0, num_tokens + lookahead)
    assert len(set(slots)) == len(slots)  # distinct slots for distinct positions


def test_slot_mapping_formula_and_errors():
    kv = KVCacheManager(8, 4)
    kv.pool.take(3)  # blocks 0..2 busy: the request gets 3, 4, 5
    kv.allocate("a", 0, 9)
    assert kv.block_tables["a"] == [3, 4, 5]
    assert kv.slot_mapping("a", 3, 3) == [15, 16, 17]  # positions 3, 4, 5: block 3 offset 3, block 4 offsets 0, 1
    with pytest.raises(IndexError, match="allocate first"):
        kv.slot_mapping("a", 10, 3)
    with pytest.raises(NoFreeBlocksError, match="need 3 free KV blocks, 2 left"):
        kv.allocate("b", 0, 12)
    assert kv.rollback("a", 4) == [4, 5] and kv.block_tables["a"] == [3]
