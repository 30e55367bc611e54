"""Flattening: many requests' new tokens into one forward's inputs and attention metadata."""

import torch

from speclab.kv_cache import KVCacheManager
from speclab.models.llama import AttentionMetadata


def flatten(kv: KVCacheManager, chunks, device="cpu") -> tuple[torch.Tensor, AttentionMetadata]:
    """Lay out a ragged batch for one forward.

    Args:
        kv: the bookkeeping of the cache the model will read and write (slots already allocated).
        chunks: (request_id, new token ids, start position) per request, in batch order.
    Returns:
        input_ids (N,) and the AttentionMetadata of the N tokens.
    """
    ids, positions, slots, starts, seq_lens, tables = [], [], [], [0], [], []
    for request_id, tokens, start in chunks:
        ids += tokens
        positions += range(start, start + len(tokens))
        slots += kv.slot_mapping(request_id, start, len(tokens))
        starts.append(starts[-1] + len(tokens))
        seq_lens.append(start + len(tokens))
        tables.append(kv.block_tables[request_id])
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.long, device=device)
    meta = AttentionMetadata(positions=torch.tensor(positions, device=device),
                             slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
                             query_start_loc=starts, seq_lens=seq_lens, block_tables=block_tables)
    return torch.tensor(ids, dtype=torch.long, device=device), meta
