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

Automatic prefix caching (vLLM v1's, off unless asked for: `enable_prefix_caching=True`). A block
whose every slot holds a committed token is *full*; it gets a key: the hash of the previous
block's key and its own tokens, so a key names the whole prefix up to the end of that block. When
a request arrives, its leading full blocks whose keys are cached are shared instead of computed
again (their reference count goes up), and its prefill starts after them. A freed block keeps its
key and waits in the free queue, reusable until the pool hands it out again (it is then evicted):
the least recently freed go first, and a request's tail before its head. At least one prompt token
is always computed, because its logits sample the first output token. Shared blocks are never
written: a request writes only past its cached prefix, in blocks of its own. (Python's built-in
hash of an int tuple: a wrong hit needs a 64-bit collision of the previous key, with equal tokens.)

This module only does integer bookkeeping; the tensors live with the model runner.
"""

import math
from collections import OrderedDict


class NoFreeBlocksError(RuntimeError):
    """The pool has fewer free blocks than a request needs."""


class BlockPool:
    """`num_blocks` block ids with reference counts, handed out from a FIFO free queue.

    A block is free when no request holds it. A free block may still hold a cached prefix block
    (`key_of`): `take` evicts it when it hands it out, `touch` takes it back for a new owner.
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.ref_count = [0] * num_blocks
        self.cached: dict[tuple, int] = {}   # prefix key -> block holding it
        self.key_of: dict[int, tuple] = {}   # block -> its key, while it holds a cached prefix block

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def take(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise NoFreeBlocksError(f"need {n} free KV blocks, {len(self.free_queue)} left")
        blocks = [self.free_queue.popitem(last=False)[0] for _ in range(n)]
        for b in blocks:
            self.ref_count[b] = 1
            key = self.key_of.pop(b, None)
            if key is not None:  # evict: its slots are about to be overwritten
                del self.cached[key]
        return blocks

    def touch(self, blocks: list[int]) -> None:
        """One more owner for each of `blocks` (cached prefix blocks, free or shared)."""
        for b in blocks:
            if self.ref_count[b] == 0:
                del self.free_queue[b]
            self.ref_count[b] += 1

    def give_back(self, blocks: list[int]) -> None:
        """One owner fewer for each block; those nobody holds join the free queue, in this order."""
        for b in blocks:
            self.ref_count[b] -= 1
            if self.ref_count[b] < 0:
                raise RuntimeError(f"KV block {b} was given back more often than it was taken")
            if self.ref_count[b] == 0:
                self.free_queue[b] = None


class KVCacheManager:
    """Per-request block tables over one BlockPool.

    Args:
        num_blocks: blocks in the pool (the cache tensors' first dimension).
        block_size: token slots per block.
        enable_prefix_caching: share the full blocks of a prefix another request computed
            (see the module docstring; vLLM's `enable_prefix_caching`).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.enable_prefix_caching = enable_prefix_caching
        self.block_keys: dict[str, list[tuple]] = {}  # request -> keys of its leading full blocks
        self.prefix_cache_queries = 0  # prompt tokens looked up, and how many of them were found
        self.prefix_cache_hits = 0     # (vLLM's prefix_cache_queries / prefix_cache_hits counters)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size)."""
        return math.ceil(num_tokens / self.block_size)

    # ------------------------------------------------------------------------------------------
    # prefix caching

    def _key(self, parent: tuple | None, tokens) -> tuple:
        return (hash(parent), tuple(tokens))

    def match_prefix(self, token_ids: list[int]) -> list[int]:
        """The cached blocks that hold the longest cached prefix of `token_ids` (full blocks only,
        and never the block of the last token, whose logits must be computed). No side effect."""
        if not self.enable_prefix_caching:
            return []
        bs, blocks, key = self.block_size, [], None
        for i in range((len(token_ids) - 1) // bs):
            key = self._key(key, token_ids[i * bs:(i + 1) * bs])
            b = self.pool.cached.get(key)
            if b is None:
                break
            blocks.append(b)
        return blocks

    def cache_full_blocks(self, request_id: str, token_ids: list[int], num_computed_tokens: int) -> None:
        """Give keys to the request's blocks that are now full of computed, committed tokens.
        A key another block already holds keeps that block (the copy here stays unkeyed)."""
        if not self.enable_prefix_caching or request_id not in self.block_tables:
            return
        keys, table, bs = self.block_keys.setdefault(request_id, []), self.block_tables[request_id], self.block_size
        for i in range(len(keys), min(num_computed_tokens // bs, len(table))):
            key = self._key(keys[-1] if keys else None, token_ids[i * bs:(i + 1) * bs])
            keys.append(key)
            b = table[i]
            if key not in self.pool.cached and b not in self.pool.key_of:
                self.pool.cached[key], self.pool.key_of[b] = b, key

    # ------------------------------------------------------------------------------------------
    # tables

    def can_fit(self, request_id: str, num_tokens: int, prefix: list[int] = ()) -> bool:
        """Whether the request's table can grow to hold `num_tokens` tokens now (starting with the
        cached `prefix` blocks from match_prefix, for a request that has none yet)."""
        have = len(self.block_tables.get(request_id, ())) + len(prefix)
        free = self.pool.num_free - sum(1 for b in prefix if self.pool.ref_count[b] == 0)
        return self.blocks_for(num_tokens) - have <= free

    def allocate(self, request_id: str, num_computed_tokens: int, num_new_tokens: int,
                 num_lookahead_tokens: int = 0, prefix: list[int] = ()) -> list[int]:
        """Grow the request's table to hold computed + new + lookahead tokens; a new request may
        start with the cached `prefix` blocks (match_prefix), which it then shares.

        Returns:
            The newly allocated blocks (possibly none). Raises NoFreeBlocksError and changes
            nothing when the pool cannot supply them.
        """
        table = self.block_tables.get(request_id, [])
        if prefix and table:
            raise ValueError(f"request {request_id} already has blocks: a cached prefix only starts a table")
        if prefix and not self.can_fit(request_id, num_computed_tokens + num_new_tokens + num_lookahead_tokens, prefix):
            raise NoFreeBlocksError(f"request {request_id}: its cached prefix and new tokens need more KV blocks "
                                    f"than the {self.pool.num_free} free")
        self.pool.touch(list(prefix))
        table = table + list(prefix)
        need = self.blocks_for(num_computed_tokens + num_new_tokens + num_lookahead_tokens) - len(table)
        new = self.pool.take(need) if need > 0 else []
        self.block_tables[request_id] = table + new
        if prefix:
            self.block_keys[request_id] = [self.pool.key_of[b] for b in prefix]
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
        keys = self.block_keys.get(request_id)
        if keys is not None:
            del keys[keep:]
        self.pool.give_back(extra)
        return extra

    def free(self, request_id: str) -> None:
        """Give back every block of a finished (or preempted) request (with prefix caching, tail
        first: the end of a prefix is evicted before its start)."""
        table = self.block_tables.pop(request_id, [])
        self.block_keys.pop(request_id, None)
        self.pool.give_back(table[::-1] if self.enable_prefix_caching else table)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free
