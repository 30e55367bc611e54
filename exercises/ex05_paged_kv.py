"""Exercise 05: a paged KV cache's arithmetic, and its rollback after verification.

Fill in the four functions, then grade yourself:
    pytest --impl=exercises tests/test_ex05_paged_kv.py
Lesson: notebooks/05_paged_kv_cache.ipynb.
"""


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold num_tokens tokens: ceil(num_tokens / block_size)."""
    raise NotImplementedError("TODO(ex05): 1 line")


def slot_mapping(block_table: list[int], block_size: int, start: int, num_tokens: int) -> list[int]:
    """Cache slots of positions start .. start + num_tokens - 1: table[t // bs] * bs + t % bs."""
    raise NotImplementedError("TODO(ex05): 1-3 lines")


def num_computed_after_verification(num_computed: int, num_draft_tokens: int, num_accepted: int) -> int:
    """The step fed 1 + k tokens (the last sampled token and k drafts); only 1 + accepted stay valid."""
    raise NotImplementedError("TODO(ex05): 1 line: the computed count moves back by the rejected drafts")


def rollback(block_table: list[int], block_size: int, num_tokens: int) -> tuple[list[int], list[int]]:
    """Keep the blocks of the first num_tokens tokens. Returns (kept table, blocks to free)."""
    raise NotImplementedError("TODO(ex05): 2 lines")
