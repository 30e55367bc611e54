"""Exercise 05, solution: a paged KV cache's arithmetic, and its rollback after verification."""

import math


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold num_tokens tokens: ceil(num_tokens / block_size)."""
    return math.ceil(num_tokens / block_size)


def slot_mapping(block_table: list[int], block_size: int, start: int, num_tokens: int) -> list[int]:
    """Cache slots of positions start .. start + num_tokens - 1: table[t // bs] * bs + t % bs."""
    return [block_table[t // block_size] * block_size + t % block_size for t in range(start, start + num_tokens)]


def num_computed_after_verification(num_computed: int, num_draft_tokens: int, num_accepted: int) -> int:
    """The step fed 1 + k tokens (the last sampled token and k drafts); only 1 + accepted stay valid."""
    return num_computed + 1 + num_accepted


def rollback(block_table: list[int], block_size: int, num_tokens: int) -> tuple[list[int], list[int]]:
    """Keep the blocks of the first num_tokens tokens. Returns (kept table, blocks to free)."""
    keep = blocks_needed(num_tokens, block_size)
    return block_table[:keep], block_table[keep:]
