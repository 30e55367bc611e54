"""Flattening: many requests' new tokens into one forward's inputs and attention metadata."""

from dataclasses import dataclass

import torch

from speclab.kv_cache import KVCacheManager
from speclab.models.llama import AttentionMetadata


@dataclass
class TreeChunk:
    """A chunk of tree nodes (lesson 10): its tokens sit in consecutive cache slots, but each has the
    position of its depth and sees only its ancestors among the slots from `base` on.

    Attributes:
        positions: (n,) each new token's position (the root's plus its depth).
        base: the first slot of the tree (slots before it hold the committed past, seen by all).
        mask: (n, end - base) bool, end the chunk's last slot + 1: which tree slots each new token sees.
    """

    positions: list[int]
    base: int
    mask: torch.Tensor


def flatten(kv: KVCacheManager, chunks, device="cpu") -> tuple[torch.Tensor, AttentionMetadata]:
    """Lay out a ragged batch for one forward.

    Args:
        kv: the bookkeeping of the cache the model will read and write (slots already allocated).
        chunks: (request_id, new token ids, first slot) per request, in batch order, optionally with a
            fourth element, a TreeChunk (tree nodes; None: a causal chunk whose positions are its slots).
    Returns:
        input_ids (N,) and the AttentionMetadata of the N tokens.
    """
    ids, positions, slots, starts, seq_lens, tables, trees = [], [], [], [0], [], [], []
    for request_id, tokens, start, *tree in chunks:
        tree = tree[0] if tree else None
        ids += tokens
        positions += tree.positions if tree is not None else range(start, start + len(tokens))
        trees.append(None if tree is None else (tree.base, tree.mask))
        slots += kv.slot_mapping(request_id, start, len(tokens))
        starts.append(starts[-1] + len(tokens))
        seq_lens.append(start + len(tokens))
        tables.append(kv.block_tables[request_id])
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.long, device=device)
    meta = AttentionMetadata(positions=torch.tensor(positions, device=device),
                             slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
                             query_start_loc=starts, seq_lens=seq_lens, block_tables=block_tables,
                             tree_masks=trees if any(t is not None for t in trees) else None)
    return torch.tensor(ids, dtype=torch.long, device=device), meta
