"""Exercise 03: prompt lookup with a per-request n-gram index, updated as tokens arrive.

Lesson 03's `lookup` rescans the whole context at every step: O(L n) per call. A server keeps
state per request instead. Here that state is a dict from every n-gram seen so far
(a tuple of token ids) to the start of its earliest occurrence; each step adds only the n-grams
that end at the newly appended positions, and a lookup is a few dict reads. The result must be
exactly vLLM's rule (longest suffix n-gram in [min, max] that occurred earlier, earliest
occurrence, up to k tokens after it, [] when none). Fill in both functions, then grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex03_ngram.py
Lesson: notebooks/03_ngram_proposer.ipynb.
"""


def update_index(index: dict, token_ids: list[int], num_indexed: int, prompt_lookup_max: int) -> int:
    """Add every n-gram (1 <= n <= prompt_lookup_max) that ends at a position in
    num_indexed .. len(token_ids) - 1, keyed by tuple(ngram) -> start of its earliest occurrence
    (an n-gram already in the index keeps its earlier start). Returns len(token_ids)."""
    raise NotImplementedError("TODO(ex03): 4 lines: two loops (new end positions, then n); never overwrite")


def propose_indexed(index: dict, token_ids: list[int], prompt_lookup_min: int, prompt_lookup_max: int,
                    k: int) -> list[int]:
    """vLLM's drafts for `token_ids`, read from an index that covers all of it."""
    raise NotImplementedError("TODO(ex03): 6 lines: longest n first; mind that the suffix itself is in the "
                              "index, so its recorded start must lie before it")
