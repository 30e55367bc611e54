"""Timing on a noisy CPU: medians of repeated runs, and the cost of one forward of speclab's model.

Used by the benchmarks, the demo, the training report and the lessons, so that every figure in
the course is measured the same way. Never used to assert a speed in a test.
"""

import statistics
import time

import torch


def median_seconds(fn, repeat: int = 20, warmup: int = 2) -> float:
    """Median wall time of `fn()` over `repeat` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timed(fn):
    """(fn's result, seconds it took): one timed call."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def forward_seconds(model, context: int = 128, tokens: int = 1, repeat: int = 40) -> float:
    """Median time of one forward of speclab's paged-KV model at batch 1: `tokens` new tokens (1: a
    decode step; k + 1: a verification) with `context` tokens already cached, logits included."""
    from speclab.engine.batch import flatten
    from speclab.kv_cache import KVCacheManager

    kv = KVCacheManager((context + tokens) // 16 + 2, 16)
    caches = model.allocate_kv_cache(kv.pool.num_blocks, 16)
    kv.allocate("r", 0, context + tokens)
    ids = torch.randint(0, model.config.vocab_size, (context + tokens,)).tolist()
    model(*flatten(kv, [("r", ids[:context], 0)]), caches)
    batch = flatten(kv, [("r", ids[context:], context)])  # the same positions are rewritten: the cache stays valid
    return median_seconds(lambda: model.compute_logits(model(*batch, caches)[0]), repeat=repeat)
