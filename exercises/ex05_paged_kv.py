"""Exercise 05: a paged KV cache over block tables that are not contiguous.

Lesson 05 allocates fresh blocks from a pool in order, so its tables look like [0, 1, 2]. A real
pool is fragmented: after requests come and go, a table is any list of block ids, say [7, 2, 9].
Everything must go through the table: the slots one forward writes for a whole batch, the keys and
values attention reads back, and what rollback returns to the pool (in any order: vLLM frees a
request's blocks tail first). Fill in the five functions, then grade yourself:
    .venv/bin/python -m pytest --impl=exercises tests/test_ex05_paged_kv.py
Lesson: notebooks/05_paged_kv_cache.ipynb.
"""


import torch


def blocks_to_allocate(num_blocks_held: int, num_computed_tokens: int, num_new_tokens: int,
                       num_lookahead_tokens: int, block_size: int) -> int:
    """New blocks a step needs so the request can hold computed + new + lookahead tokens (>= 0)."""
    raise NotImplementedError("TODO(ex05): 2 lines: ceil over all three token counts, minus what is held")


def slot_mapping_batch(block_tables: list[list[int]], block_size: int, num_computed_tokens: list[int],
                       num_new_tokens: list[int]) -> list[int]:
    """The flattened slot mapping of one forward: for each request in order, the slots of its
    positions num_computed .. num_computed + num_new - 1, through its own block table."""
    raise NotImplementedError("TODO(ex05): 1-4 lines: one list over requests, each through its own table")


def gather_kv(kv_cache: torch.Tensor, block_table: list[int], seq_len: int) -> torch.Tensor:
    """A request's first seq_len cached vectors in position order.

    Args:
        kv_cache: (num_blocks, block_size, H, D) one layer's keys (or values).
    Returns:
        (seq_len, H, D).
    """
    raise NotImplementedError("TODO(ex05): 2-3 lines: index kv_cache with the table, then flatten blocks into positions")


def num_computed_after_verification(num_computed_tokens: int, num_draft_tokens: int, num_accepted: int) -> int:
    """vLLM's rollback of the counter: scheduling already advanced num_computed_tokens by 1 + k
    (the last sampled token and k drafts); verification keeps 1 + accepted of them."""
    raise NotImplementedError("TODO(ex05): 1 line: move back by the rejected drafts")


def rollback(block_table: list[int], block_size: int, num_tokens: int) -> tuple[list[int], list[int]]:
    """Keep the blocks of the first num_tokens tokens. Returns (kept table, blocks to free, any order)."""
    raise NotImplementedError("TODO(ex05): 2 lines")
