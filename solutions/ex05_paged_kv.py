"""Exercise 05, solution: a paged KV cache over block tables that are not contiguous.

After a few requests have come and gone, a request's blocks are scattered over the pool: its block
table is an arbitrary list of block ids. Everything must go through the table: the slots a forward
writes, the keys and values attention reads, and what rollback gives back.
"""

import math

import torch


def blocks_to_allocate(num_blocks_held: int, num_computed_tokens: int, num_new_tokens: int,
                       num_lookahead_tokens: int, block_size: int) -> int:
    """New blocks a step needs so the request can hold computed + new + lookahead tokens (>= 0)."""
    need = math.ceil((num_computed_tokens + num_new_tokens + num_lookahead_tokens) / block_size)
    return max(0, need - num_blocks_held)


def slot_mapping_batch(block_tables: list[list[int]], block_size: int, num_computed_tokens: list[int],
                       num_new_tokens: list[int]) -> list[int]:
    """The flattened slot mapping of one forward: for each request in order, the slots of its
    positions num_computed .. num_computed + num_new - 1, through its own block table."""
    return [table[t // block_size] * block_size + t % block_size
            for table, start, n in zip(block_tables, num_computed_tokens, num_new_tokens)
            for t in range(start, start + n)]


def gather_kv(kv_cache: torch.Tensor, block_table: list[int], seq_len: int) -> torch.Tensor:
    """A request's first seq_len cached vectors in position order.

    Args:
        kv_cache: (num_blocks, block_size, H, D) one layer's keys (or values).
    Returns:
        (seq_len, H, D).
    """
    block_size = kv_cache.shape[1]
    blocks = kv_cache[block_table[:math.ceil(seq_len / block_size)]]  # (n, block_size, H, D)
    return blocks.reshape(-1, *kv_cache.shape[2:])[:seq_len]


def num_computed_after_verification(num_computed_tokens: int, num_draft_tokens: int, num_accepted: int) -> int:
    """vLLM's rollback of the counter: scheduling already advanced num_computed_tokens by 1 + k
    (the last sampled token and k drafts); verification keeps 1 + accepted of them."""
    return num_computed_tokens - (num_draft_tokens - num_accepted)


def rollback(block_table: list[int], block_size: int, num_tokens: int) -> tuple[list[int], list[int]]:
    """Keep the blocks of the first num_tokens tokens. Returns (kept table, blocks to free, any order)."""
    keep = math.ceil(num_tokens / block_size)
    return block_table[:keep], block_table[keep:]
