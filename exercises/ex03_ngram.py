"""Exercise 03: the n-gram (prompt lookup) proposer, with vLLM's semantics.

Fill in `propose`, then grade yourself:
    pytest --impl=exercises tests/test_ex03_ngram.py
Lesson: notebooks/03_ngram_proposer.ipynb.
"""


def propose(token_ids: list[int], prompt_lookup_min: int, prompt_lookup_max: int, k: int) -> list[int]:
    """Drafts copied from the context: the up to k tokens that followed an earlier occurrence of its suffix.

    Try suffix lengths n from prompt_lookup_max down to prompt_lookup_min; the first n whose last-n
    tokens also occur earlier (an occurrence that ends before the last token; overlaps allowed) wins,
    and among its occurrences the earliest wins. Return the up to k tokens after that occurrence,
    or [] when no n in [min, max] matches.
    """
    raise NotImplementedError("TODO(ex03): 5-8 lines: two loops, longest n first, then earliest start")
