"""The paged KV cache's bookkeeping: a block pool, block tables, slot mapping, rollback.

Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention"
(SOSP 2023), as vLLM v1 runs it. The cache tensors are cut into fixed-size blocks of
`block_size` token slots. Each request owns a *block table*: the list of blocks that hold its
tokens in order, so token position t lives in slot  table[t // block_size] * block_size +
t % block_size  (the *slot mapping*). Blocks come from a free queue and go back to it.

Speculative decoding adds two things. A step that verifies k drafts writes k + 1 new slots
(plus lookahead slots for a drafter that runs ahead). After verification only the accepted
tokens are kept: the request's computed-token count moves back by the number rejected, and
`rollback` returns the blocks past ceil(tokens / block_size) to the pool. (vLLM keeps those
blocks and lets the next step overwrite the stale slots; lesson 05 shows why both are correct.)

This module only does integer bookkeeping; the tensors live with the model runner.
"""

import math
from collections import deque


class NoFreeBlocksError(RuntimeError):
    """The pool has fewer free blocks than a request needs."""


class BlockPool:
    """`num_blocks` block ids, handed out from a FIFO free queue."""

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.free_queue = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def take(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise NoFreeBlocksError(f"need {n} free KV blocks, {len(self.free_queue)} left")
        return [self.free_queue.popleft() for _ in range(n)]

    def give_back(self, blocks: list[int]) -> None:
        self.free_queue.extend(blocks)


class KVCacheManager:
    """Per-request block tables over one BlockPool.

    Args:
        num_blocks: blocks in the pool (the cache tensors' first dimension).
        block_size: token slots per block.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size)."""
        return math.ceil(num_tokens / self.block_size)

    def can_fit(self, request_id: str, num_tokens: int) -> bool:
        """Whether the request's table can grow to hold `num_tokens` tokens now."""
        have = len(self.block_tables.get(request_id, ()))
        return self.blocks_for(num_tokens) - have <= self.pool.num_free

    def allocate(self, request_id: str, num_computed_tokens: int, num_new_tokens: int,
                 num_lookahead_tokens: int = 0) -> list[int]:
        """Grow the request's table to hold computed + new + lookahead tokens.

        Returns:
            The newly allocated blocks (possibly none). Raises NoFreeBlocksError and changes
            nothing when the pool cannot supply them.
        """
        table = self.block_tables.get(request_id, [])
        need = self.blocks_for(num_computed_tokens + num_new_tokens + num_lookahead_tokens) - len(table)
        new = self.pool.take(need) if need > 0 else []  # raises before anything changes
        self.block_tables[request_id] = table + new
        return new

    def slot_mapping(self, request_id: str, start: int, num_tokens: int) -> list[int]:
        """Cache slots of positions start .. start + num_tokens - 1 of the request."""
        table, bs = self.block_tables[request_id], self.block_size
        if self.blocks_for(start + num_tokens) > len(table):
            raise IndexError(f"request {request_id}: position {start + num_tokens - 1} is past its "
                             f"{len(table)} blocks; allocate first")
        return [table[t // bs] * bs + t % bs for t in range(start, start + num_tokens)]

    def rollback(self, request_id: str, num_tokens: int) -> list[int]:
        """Keep only the first `num_tokens` tokens: blocks past ceil(num_tokens / block_size) go back.

        Returns:
            The blocks returned to the pool.
        """
        table = self.block_tables[request_id]
        keep = self.blocks_for(num_tokens)
        extra = table[keep:]
        del table[keep:]
        self.pool.give_back(extra)
        return extra

    def free(self, request_id: str) -> None:
        """Return every block of a finished (or preempted) request."""
        self.pool.give_back(self.block_tables.pop(request_id, []))

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free
