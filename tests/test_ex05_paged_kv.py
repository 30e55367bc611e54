"""Grades exercise 05 (paged KV arithmetic and rollback). `pytest --impl=exercises tests/test_ex05_paged_kv.py`."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speclab.kv_cache import KVCacheManager

EXERCISE = "ex05_paged_kv"
pytestmark = pytest.mark.exercise


def test_blocks_needed(impl):
    assert [impl.blocks_needed(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert impl.blocks_needed(17, 16) == 2 and impl.blocks_needed(1, 1) == 1


@settings(max_examples=60, deadline=None)
@given(block_size=st.integers(1, 16), start=st.integers(0, 40), n=st.integers(1, 20))
def test_slot_mapping_matches_speclab(impl, block_size, start, n):
    kv = KVCacheManager(200, block_size)
    kv.pool.take(7)  # the request's blocks do not start at 0
    kv.allocate("r", 0, start + n)
    assert impl.slot_mapping(kv.block_tables["r"], block_size, start, n) == kv.slot_mapping("r", start, n)


def test_slot_mapping_by_hand(impl):
    assert impl.slot_mapping([7, 2, 9], 4, 2, 7) == [30, 31, 8, 9, 10, 11, 36]


def test_num_computed_after_verification(impl):
    # 10 tokens in the cache; the step fed the last sampled token + 4 drafts (positions 10..14)
    assert impl.num_computed_after_verification(10, 4, 4) == 15  # all accepted: nothing rolled back
    assert impl.num_computed_after_verification(10, 4, 1) == 12  # 3 rejected: back from 15 to 12
    assert impl.num_computed_after_verification(10, 0, 0) == 11  # plain decoding


@settings(max_examples=60, deadline=None)
@given(block_size=st.integers(1, 8), total=st.integers(1, 60), data=st.data())
def test_rollback_matches_speclab(impl, block_size, total, data):
    keep_tokens = data.draw(st.integers(0, total))
    kv = KVCacheManager(100, block_size)
    kv.allocate("r", 0, total)
    table = list(kv.block_tables["r"])
    kept, freed = impl.rollback(table, block_size, keep_tokens)
    assert freed == kv.rollback("r", keep_tokens) and kept == kv.block_tables["r"]
    assert len(kept) == math.ceil(keep_tokens / block_size) and kept + freed == table
