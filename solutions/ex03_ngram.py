"""Exercise 03, solution: the n-gram (prompt lookup) proposer, with vLLM's semantics."""


def propose(token_ids: list[int], prompt_lookup_min: int, prompt_lookup_max: int, k: int) -> list[int]:
    """Drafts copied from the context: the up to k tokens that followed an earlier occurrence of its suffix.

    Try suffix lengths n from prompt_lookup_max down to prompt_lookup_min; the first n whose last-n
    tokens also occur earlier (an occurrence that ends before the last token; overlaps allowed) wins,
    and among its occurrences the earliest wins. Return the up to k tokens after that occurrence,
    or [] when no n in [min, max] matches.
    """
    tokens, L = list(token_ids), len(token_ids)
    for n in range(min(prompt_lookup_max, L - 1), prompt_lookup_min - 1, -1):
        suffix = tokens[L - n:]
        for start in range(L - n):  # every occurrence that ends before the last token
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []
