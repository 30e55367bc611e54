"""Grades exercise 06 (the flattened ragged layout, greedy). `pytest --impl=exercises tests/test_ex06_batched_verification.py`."""

import pytest
import torch

from speclab.verify import rejection_sample

EXERCISE = "ex06_batched_verification"
pytestmark = pytest.mark.exercise


def one_hot_rows(tokens, V):
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).double()


def test_target_rows_by_hand(impl):
    assert impl.target_rows([3, 0, 2]) == ([0, 1, 2, 5, 6], [3, 4, 7])
    assert impl.target_rows([0, 0]) == ([], [0, 1])
    assert impl.target_rows([1]) == ([0], [1])
    assert impl.target_rows([]) == ([], [])


def test_target_rows_partition_the_rows(impl):
    ks = [2, 0, 5, 1, 0, 3]
    verify, bonus = impl.target_rows(ks)
    assert len(verify) == sum(ks) and len(bonus) == len(ks)
    assert sorted(verify + bonus) == list(range(sum(ks) + len(ks)))


def test_greedy_by_hand(impl):
    # request 0: k=3, all accepted -> 3 drafts + bonus; request 1: k=0 -> just the bonus;
    # request 2: k=2, first draft rejected -> the target's token at that row
    drafts = torch.tensor([4, 1, 2, 3, 0])
    target = one_hot_rows([4, 1, 2, 7, 6, 5, 3, 1], V=8)  # rows: r0: 0..3, r1: 4, r2: 5..7
    out = impl.greedy_verify_batch(drafts, [3, 0, 2], target)
    assert out.tolist() == [[4, 1, 2, 7], [6, -1, -1, -1], [5, -1, -1, -1]]
    assert out.dtype == torch.int64


def test_all_zero_drafts(impl):
    out = impl.greedy_verify_batch(torch.empty(0, dtype=torch.long), [0, 0], one_hot_rows([2, 1], 3))
    assert out.tolist() == [[2], [1]]


@pytest.mark.parametrize("seed", range(25))
def test_matches_rejection_sample(impl, seed):
    g = torch.Generator().manual_seed(seed)
    B = int(torch.randint(1, 7, (1,), generator=g))
    V = int(torch.randint(2, 12, (1,), generator=g))  # small V: drafts often hit the argmax
    ks = torch.randint(0, 5, (B,), generator=g).tolist()
    T = sum(ks)
    p = torch.randn(T + B, V, generator=g, dtype=torch.float64).mul(3).softmax(-1)
    verify = [cu + r + j for r, (cu, k) in enumerate(zip(torch.tensor([0] + ks).cumsum(0).tolist(), ks)) for j in range(k)]
    drafts = p[verify].argmax(-1) if T else torch.empty(0, dtype=torch.long)  # start from right guesses...
    flip = torch.rand(T, generator=g) < 0.3
    drafts = torch.where(flip, torch.randint(0, V, (T,), generator=g), drafts)  # ...and spoil some
    expected = rejection_sample(drafts, ks, p, greedy=True)
    assert torch.equal(impl.greedy_verify_batch(drafts, ks, p), expected)
