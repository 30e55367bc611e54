"""The n-gram proposer has vLLM's prompt-lookup semantics (DESIGN.md), checked against a brute force."""

import numpy as np
import pytest

from speclab.proposers.ngram import NgramProposer


def brute_force(tokens, lo, hi, k):
    """Longest n in [lo, hi] whose suffix occurs earlier; earliest occurrence; the k tokens after it."""
    L = len(tokens)
    for n in range(min(hi, L - 1), lo - 1, -1):
        for i in range(L - n):
            if tokens[i:i + n] == tokens[L - n:]:
                return tokens[i + n:i + n + k]
    return []


def test_hand_cases():
    p = NgramProposer(2, 4, 3)
    assert p.propose_tokens([1, 2, 3, 4, 1, 2, 3]) == [4, 1, 2]  # suffix [1,2,3] seen at 0
    assert p.propose_tokens([7, 1, 2, 9, 8, 1, 2, 5, 1, 2]) == [9, 8, 1]  # [1, 2] twice: the earliest wins
    assert p.propose_tokens([1, 2, 3, 5, 2, 3, 9, 1, 2, 3]) == [5, 2, 3]  # longest (3) beats the later 2-gram
    assert p.propose_tokens([1, 2, 3]) == []  # nothing repeats
    assert p.propose_tokens([4, 4, 4]) == [4]  # overlapping match; only one token follows it
    assert NgramProposer(3, 3, 2).propose_tokens([1, 2, 9, 1, 2]) == []  # a 2-gram is below min
    assert p.propose_tokens([1, 2, 3, 1, 2], k=1) == [3]


def test_agrees_with_brute_force_on_random_contexts():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        lo = int(rng.integers(1, 4))
        hi, k = lo + int(rng.integers(0, 3)), int(rng.integers(1, 7))
        tokens = rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(1, 40))).tolist()
        assert NgramProposer(lo, hi, k).propose_tokens(tokens) == brute_force(tokens, lo, hi, k), (tokens, lo, hi, k)


def test_bad_settings():
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        NgramProposer(3, 2, 4)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        NgramProposer(1, 2, 0)


def test_engine_path_keeps_each_requests_context_incrementally():
    """propose() copies only new tokens into a per-request buffer; it must see exactly all_token_ids."""
    from speclab.engine.request import Request
    from speclab.sampling_params import SamplingParams

    rng = np.random.default_rng(1)
    p = NgramProposer(1, 3, 4)
    reqs = [Request(str(i), rng.integers(0, 5, int(rng.integers(1, 30))).tolist(), SamplingParams(max_tokens=500))
            for i in range(3)]
    for _ in range(120):
        for r in reqs:
            r.output_token_ids += rng.integers(0, 5, int(rng.integers(1, 4))).tolist()
        got = [prop.token_ids for prop in p.propose(reqs, [4, 2, 0])]
        assert got == [p.propose_tokens(reqs[0].all_token_ids, 4), p.propose_tokens(reqs[1].all_token_ids, 2), []]
    p.remove([reqs[0].request_id])
    assert "0" not in p._contexts
