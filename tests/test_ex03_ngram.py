"""Grades exercise 03 (prompt lookup). `pytest --impl=exercises tests/test_ex03_ngram.py`."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speclab.proposers.ngram import NgramProposer

EXERCISE = "ex03_ngram"
pytestmark = pytest.mark.exercise


def test_copies_what_followed(impl):
    tokens = [1, 2, 3, 4, 5, 9, 2, 3]
    assert impl.propose(tokens, 2, 3, 3) == [4, 5, 9]  # suffix [2, 3] occurred at 1..2
    assert impl.propose(tokens, 2, 3, 1) == [4]
    assert impl.propose(tokens, 2, 3, 10) == [4, 5, 9, 2, 3]  # fewer than k when the context ends


def test_longest_suffix_wins(impl):
    tokens = [7, 3, 8, 1, 3, 5, 1, 3]  # [1, 3] occurs at 3..4 (then 5); [3] first occurs at 1 (then 8)
    assert impl.propose(tokens, 1, 2, 2) == [5, 1]
    assert impl.propose(tokens, 1, 1, 2) == [8, 1]  # only 1-grams allowed: the earliest 3


def test_earliest_occurrence_wins(impl):
    tokens = [4, 6, 0, 4, 6, 1, 4, 6]  # [4, 6] at 0 (then 0) and at 3 (then 1)
    assert impl.propose(tokens, 2, 2, 1) == [0]


def test_no_match_and_min(impl):
    assert impl.propose([1, 2, 3, 4], 1, 3, 4) == []  # the last token never occurred before
    assert impl.propose([5, 1, 9, 1], 2, 3, 4) == []  # only a 1-gram matches, but min is 2
    assert impl.propose([5, 1, 9, 1], 1, 3, 4) == [9, 1]
    assert impl.propose([3], 1, 2, 4) == [] and impl.propose([], 1, 2, 4) == []


def test_overlapping_occurrence(impl):
    assert impl.propose([2, 2, 2, 2], 1, 3, 5) == [2]  # [2, 2, 2] at 0..2 is followed by one token


def test_k_zero(impl):
    assert impl.propose([1, 2, 1, 2], 1, 2, 0) == []


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), max_size=30), lo=st.integers(1, 4), span=st.integers(0, 3),
       k=st.integers(1, 6))
def test_matches_speclab(impl, tokens, lo, span, k):
    expected = NgramProposer(lo, lo + span, k).propose_tokens(tokens)
    assert impl.propose(tokens, lo, lo + span, k) == expected


def test_matches_speclab_on_long_contexts(impl):
    rng = random.Random(0)
    for _ in range(100):
        V = rng.choice([2, 5, 50])
        tokens = [rng.randrange(V) for _ in range(rng.randrange(1, 300))]
        lo = rng.randint(1, 4)
        hi = lo + rng.randint(0, 4)
        k = rng.randint(1, 8)
        assert impl.propose(tokens, lo, hi, k) == NgramProposer(lo, hi, k).propose_tokens(tokens), (tokens, lo, hi, k)
