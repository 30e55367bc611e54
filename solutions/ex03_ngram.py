"""Exercise 03, solution: prompt lookup with a per-request n-gram index, updated as tokens arrive.

vLLM's rule (lesson 03): the longest suffix n-gram (prompt_lookup_min <= n <= prompt_lookup_max)
that occurs earlier wins, its earliest occurrence wins, and the up to k tokens after it are the
drafts. Rescanning the context costs O(L n) per step; a server instead keeps state per request.
Here that state is a dict from every n-gram seen so far to the start of its earliest occurrence,
extended by the n-grams that end at the newly appended positions only.
"""


def update_index(index: dict, token_ids: list[int], num_indexed: int, prompt_lookup_max: int) -> int:
    """Add every n-gram (1 <= n <= prompt_lookup_max) that ends at a position in
    num_indexed .. len(token_ids) - 1, keyed by tuple(ngram) -> start of its earliest occurrence
    (an n-gram already in the index keeps its earlier start). Returns len(token_ids)."""
    for end in range(num_indexed, len(token_ids)):
        for n in range(1, min(prompt_lookup_max, end + 1) + 1):
            index.setdefault(tuple(token_ids[end - n + 1:end + 1]), end - n + 1)
    return len(token_ids)


def propose_indexed(index: dict, token_ids: list[int], prompt_lookup_min: int, prompt_lookup_max: int,
                    k: int) -> list[int]:
    """vLLM's drafts for `token_ids`, read from an index that covers all of it."""
    L = len(token_ids)
    for n in range(min(prompt_lookup_max, L - 1), prompt_lookup_min - 1, -1):
        start = index.get(tuple(token_ids[L - n:]))
        if start is not None and start < L - n:  # the suffix itself is indexed: it must occur earlier
            return list(token_ids[start + n:start + n + k])
    return []
