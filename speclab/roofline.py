"""The memory roofline of decoding: how close a batch-1 decode step comes to reading the weights
at the machine's memory bandwidth.

At batch 1 every decode step reads every weight once (each projection, and the output head) and
does two flops per weight, far too little arithmetic to hide the read: the step takes at least
weight_bytes / bandwidth seconds (Williams, Waterman & Patterson, "Roofline", 2009). So

    fraction of the roofline = weight_bytes_per_token * tokens_per_second / bandwidth

with the bandwidth measured on the same machine, in the same run, with the same torch threads,
by the simplest large read torch does: summing an array much larger than the last-level cache,
held in the same kind of memory as the weights (huge pages where `speclab.models.huge_pages` puts
them there: on 2026-12-04's Zen 4 the sum read 33-34 GB/s from huge pages against 23-25 from
torch's ordinary allocation, so a roofline against the latter would flatter every figure).
Used by `python -m speclab.bench roofline` and lesson 00. (The KV cache read is left out: at a few
hundred tokens of context it is about 1% of the weights of SmolLM2-135M.)
"""

import torch

from speclab.models import huge_pages
from speclab.models.llama import LlamaForCausalLM
from speclab.timing import median_seconds


def read_bandwidth(nbytes: int = 512 * 2**20, repeat: int = 7) -> float:
    """Bytes per second that `torch.sum` reads from memory here, with torch's current thread count.

    Args:
        nbytes: the array's size; keep it far above the last-level cache (tens of MB on a CPU).
        repeat: timed sums; the median is returned (the machine may be shared).
    """
    x = huge_pages.allocate(nbytes // 4 * 4).view(torch.float32) if huge_pages.enabled() else \
        torch.empty(nbytes // 4, dtype=torch.float32)
    x.fill_(1.0)
    return x.numel() * 4 / median_seconds(x.sum, repeat=repeat, warmup=1)  # warm-up: pages touched, code loaded


def weight_bytes_per_token(model: LlamaForCausalLM) -> int:
    """Bytes of weights a batch-1 decode step reads: every parameter once, except an untied input
    embedding (a step looks up one row of it). A tied embedding is read in full as the output head."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # shared (tied) weights once
    if not model.config.tie_word_embeddings:
        emb = model.model.embed_tokens.weight
        total -= emb.numel() * emb.element_size()
    return total


def roofline_fraction(tokens_per_second: float, bytes_per_token: int, bandwidth: float) -> float:
    """The fraction of the machine's read bandwidth a decode at `tokens_per_second` uses on weights."""
    return tokens_per_second * bytes_per_token / bandwidth
