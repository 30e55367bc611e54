"""Grades exercise 03 (prompt lookup with an incremental per-request index).
`pytest --impl=exercises tests/test_ex03_ngram.py`. Negative controls at the bottom grade the
grader (skipped under --impl=exercises)."""

import random

import pytest

from speclab.proposers.ngram import NgramProposer

EXERCISE = "ex03_ngram"
pytestmark = pytest.mark.exercise


def check_stream(update_index, propose_indexed, seed, steps=60):
    """Grow one request's context in random chunks, index incrementally, compare with vLLM's rule."""
    rng = random.Random(seed)
    V = rng.choice([2, 3, 5, 20])
    lo = rng.randint(1, 3)
    hi = lo + rng.randint(0, 3)
    k = rng.randint(1, 6)
    tokens, index, done = [], {}, 0
    for _ in range(steps):
        tokens += [rng.randrange(V) for _ in range(rng.randint(1, 4))]
        done = update_index(index, tokens, done, hi)
        if done != len(tokens):
            return f"update_index must return len(token_ids) = {len(tokens)} (the new num_indexed), got {done}"
        want = NgramProposer(lo, hi, k).propose_tokens(tokens)
        got = propose_indexed(index, tokens, lo, hi, k)
        if got != want:
            return (f"context {tokens} (min={lo}, max={hi}, k={k}), indexed in chunks as it grew: vLLM's rule "
                    f"drafts {want}, you drafted {got}. {explain(tokens, lo, hi, k)}")
    return None


def explain(tokens, lo, hi, k):
    L = len(tokens)
    for n in range(min(hi, L - 1), lo - 1, -1):
        suffix = tokens[L - n:]
        for start in range(L - n):
            if tokens[start:start + n] == suffix:
                return (f"The longest suffix with an earlier occurrence is {suffix} (n={n}); its earliest "
                        f"occurrence starts at {start}, so the drafts are the up to {k} tokens from {start + n}.")
    return (f"No suffix of length {lo}..{hi} occurs before the end (the suffix itself, at the end of the "
            f"context, does not count), so there are no drafts.")


def test_index_by_hand(impl):
    index = {}
    n = impl.update_index(index, [1, 2, 1], 0, 2)
    want = {(1,): 0, (2,): 1, (1, 2): 0, (2, 1): 1}
    if index != want or n != 3:
        pytest.fail(f"indexing [1, 2, 1] with max 2 from scratch: every 1- and 2-gram ending at positions 0..2, "
                    f"mapped to its earliest start: want {want} and 3, got {index} and {n}", pytrace=False)
    n = impl.update_index(index, [1, 2, 1, 2], 3, 2)
    if index != want:
        pytest.fail(f"appending 2 adds (2,) and (1, 2), which were already seen: their earliest starts 1 and 0 must "
                    f"stay (vLLM drafts from the *earliest* occurrence); index became {index}", pytrace=False)
    impl.update_index(index, [1, 2, 1, 2, 7], 4, 2)
    if index.get((7,)) != 4 or index.get((2, 7)) != 3:
        pytest.fail(f"appending 7 at position 4 adds (7,) -> 4 and (2, 7) -> 3: an n-gram that ends at a new "
                    f"position may start at an old one; got {index}", pytrace=False)


def test_propose_by_hand(impl):
    cases = [([1, 2, 3, 4, 5, 9, 2, 3], 2, 3, 3, [4, 5, 9], "suffix [2, 3] occurred at 1..2"),
             ([7, 3, 8, 1, 3, 5, 1, 3], 1, 2, 2, [5, 1], "the longest suffix [1, 3] wins over [3]"),
             ([4, 6, 0, 4, 6, 1, 4, 6], 2, 2, 1, [0], "[4, 6] occurs at 0 and 3: the earliest wins"),
             ([5, 1, 9], 1, 3, 4, [], "9 occurs only at the end: the suffix itself is no earlier occurrence"),
             ([5, 1, 9, 1], 2, 3, 4, [], "only a 1-gram matches, but prompt_lookup_min is 2"),
             ([2, 2, 2, 2], 1, 3, 5, [2], "[2, 2, 2] at 0..2 overlaps the suffix and is followed by one token"),
             ([1, 2, 1, 2], 1, 2, 0, [], "k = 0 drafts nothing"),
             ([3], 1, 2, 4, [], "one token has no earlier occurrence")]
    for tokens, lo, hi, k, want, why in cases:
        index = {}
        impl.update_index(index, tokens, 0, hi)
        got = impl.propose_indexed(index, tokens, lo, hi, k)
        if got != want:
            pytest.fail(f"{tokens} (min={lo}, max={hi}, k={k}): want {want} because {why}; got {got}", pytrace=False)


@pytest.mark.parametrize("seed", range(30))
def test_incremental_matches_vllm_rule(impl, seed):
    message = check_stream(impl.update_index, impl.propose_indexed, seed)
    if message:
        pytest.fail(message, pytrace=False)


class CountingDict(dict):
    """A dict that counts reads and writes, to check that an update touches only new n-grams."""

    touches = 0

    def _touch(self):
        CountingDict.touches += 1

    def __setitem__(self, key, value):
        self._touch(); super().__setitem__(key, value)

    def __getitem__(self, key):
        self._touch(); return super().__getitem__(key)

    def __contains__(self, key):
        self._touch(); return super().__contains__(key)

    def get(self, key, default=None):
        self._touch(); return super().get(key, default)

    def setdefault(self, key, default=None):
        self._touch(); return super().setdefault(key, default)


def check_incremental_cost(update_index):
    rng = random.Random(7)
    tokens = [rng.randrange(50) for _ in range(2000)]
    index = CountingDict()
    done = update_index(index, tokens, 0, 4)
    CountingDict.touches = 0
    tokens.append(3)
    update_index(index, tokens, done, 4)
    if CountingDict.touches > 3 * 4 + 4:
        return (f"appending one token to a 2000-token context touched the index {CountingDict.touches} times: only "
                f"the 4 n-grams that end at the new position are new, so an update costs O(prompt_lookup_max) "
                f"per token, not a rescan of the context")
    return None


def test_update_touches_only_new_ngrams(impl):
    message = check_incremental_cost(impl.update_index)
    if message:
        pytest.fail(message, pytrace=False)


# ---------------------------------------------------------------------------------------------
# Negative controls


def update_overwrites(index, token_ids, num_indexed, prompt_lookup_max):
    """BUG: index[g] = start keeps the *latest* occurrence."""
    for end in range(num_indexed, len(token_ids)):
        for n in range(1, min(prompt_lookup_max, end + 1) + 1):
            index[tuple(token_ids[end - n + 1:end + 1])] = end - n + 1
    return len(token_ids)


def update_new_starts_only(index, token_ids, num_indexed, prompt_lookup_max):
    """BUG: indexes n-grams that *start* at new positions, missing those straddling old and new tokens."""
    for start in range(num_indexed, len(token_ids)):
        for n in range(1, prompt_lookup_max + 1):
            if start + n <= len(token_ids):
                index.setdefault(tuple(token_ids[start:start + n]), start)
    return len(token_ids)


def update_rescans(index, token_ids, num_indexed, prompt_lookup_max):
    """Correct answers, but a full rescan each step (O(L) per token)."""
    from solutions.ex03_ngram import update_index
    return update_index(index, token_ids, 0, prompt_lookup_max)


def propose_counts_itself(index, token_ids, prompt_lookup_min, prompt_lookup_max, k):
    """BUG: takes the suffix's own entry as an earlier occurrence (and then drafts nothing)."""
    L = len(token_ids)
    for n in range(min(prompt_lookup_max, L - 1), prompt_lookup_min - 1, -1):
        start = index.get(tuple(token_ids[L - n:]))
        if start is not None:
            return list(token_ids[start + n:start + n + k])
    return []


def first_failure(update, propose):
    for seed in range(30):
        message = check_stream(update, propose, seed)
        if message:
            return message
    return None


@pytest.mark.parametrize("update, propose", [
    (update_overwrites, None), (update_new_starts_only, None), (None, propose_counts_itself)],
    ids=["overwrites_with_latest", "indexes_new_starts_only", "suffix_counts_as_its_own_occurrence"])
def test_control_stream_check_catches(controls, update, propose):
    from solutions.ex03_ngram import propose_indexed, update_index
    message = first_failure(update or update_index, propose or propose_indexed)
    assert message is not None, "the stream check passed a broken proposer"
    print(message)


def test_control_cost_check_catches_a_rescan(controls):
    message = check_incremental_cost(update_rescans)
    assert message is not None
    print(message)
