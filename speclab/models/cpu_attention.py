"""Paged attention on a CPU in a small kernel of our own: each query reads its request's cache in place.

torch has no attention over a paged cache, so `llama.paged_attention`'s torch path gathers every
request's blocks into a padded (B, Cmax) copy in every layer and runs one masked SDPA over the
rectangle. That is right and general (trees, any dtype, any device), but on a CPU its cost grows
with the batch: in a batch-8 decode step of SmolLM2 over ~200 cached tokens (one thread, float32,
2026-12-02) the gather and SDPA took about a fifth of the step. `cpu_attention.cpp` walks each
token's slots 0..t through the block table instead: no copy, no padding, and no work behind the
causal mask.

It also gives a token's attention the same bits whatever else is in the forward (the .cpp says
how): with `cpu_gemm`'s projections, a token's hidden state in a one-token decode step and in a
k + 1 token verify step differ only where the number of rows moves a projection off the kernel.

In bfloat16 the kernel reads the bf16 cache as it is (widening each key and value to float32 as it
loads it), computes in float32 as it does for a float32 model, and the output is rounded to bf16
once. That same-bits property matters most there: torch's bf16 SDPA over the padded rectangle
rounded a token's attention differently in a decode step and in a verify step on a 2-core Intel
Xeon with AMX (2026-12-02), enough for the distilled draft's greedy speculation to change a
SmolLM2 answer at its 15th token (tests/test_10_smollm2_spec.py); with the kernel it does not.

A tree of drafts (lesson 10) takes the kernel too: each node reads its request's slots as they are
and gives the slots it must not see (its siblings' and cousins') a weight of exactly 0, so its
output has the bits of the same token in a chain of its ancestors. Against the torch path's gather
and masked SDPA, a SmolLM2 forward verifying bench heads' 4-node static tree was 1.01x at batch 1 and
1.15x at batch 8 (`python -m speclab.bench attention`, 2026-12-03, Zen 3 EPYC, one thread, load average
1.0 from the benchmark itself; 6 interleaved rounds, ranges 0.84-1.33x and 1.12-1.37x).

Where it runs: float32 or bfloat16 on a CPU, one torch thread (the kernel is single-threaded; with
more threads SDPA uses them all), a head_dim that is a multiple of 8 up to 128. Built like `cpu_gemm`
(`speclab.models.native`); SPECLAB_CPU_ATTENTION=0 turns it off, and without a compiler `available()` is False (cpu_gemm's
warning already says so) and attention takes the torch path.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from speclab.models import native

SOURCE = Path(__file__).with_name("cpu_attention.cpp")
MAX_HEAD_DIM = 128  # as cpu_attention.cpp's MAX_DH (each head_dim up to it is compiled: a build of several seconds)

DTYPES = (torch.float32, torch.bfloat16)  # the caches' dtypes the kernel reads
_fn = None   # {cache dtype: the loaded function}, False once loading failed
_why = ""


def _load():
    global _fn, _why
    if _fn is None:
        p, n = ctypes.c_void_p, ctypes.c_long
        args = [p, n, n, p, p, n, p, n, p, p, p, n, n, n, n, n, ctypes.c_float, p, p, n]
        fns = {}
        for dtype, symbol in zip(DTYPES, ("speclab_paged_attention", "speclab_paged_attention_bf16")):
            fns[dtype], _why = native.load(SOURCE, symbol, args, ctypes.c_int, "SPECLAB_CPU_ATTENTION")
            if fns[dtype] is None:
                break
        _fn = fns if all(fns.get(d) for d in DTYPES) else False
    return _fn


def available() -> bool:
    """Whether the kernel is built and loaded here (building it on first call)."""
    return bool(_load())


def why_unavailable() -> str:
    """Why `available()` is False ('' when it is True)."""
    _load()
    return _why


BLOCK_ERROR = ("a token's position reaches a cache block its request's block table does not hold (a -1 or an id "
               "outside the pool): the scheduler must allocate slots before the forward")


def entry_point(dtype: torch.dtype):
    """The kernel's entry point for caches of `dtype` (float32 or bfloat16), loading it if need be."""
    fns = _fn or _load()
    if not fns:
        raise RuntimeError(f"speclab's CPU attention kernel is not available: {_why}")
    return fns[dtype]


def applies(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel takes this attention call (the module docstring's conditions)."""
    Dh = q.shape[-1]
    return (q.device.type == "cpu" and q.dtype == k_cache.dtype and q.dtype in DTYPES
            and Dh % 8 == 0 and Dh <= MAX_HEAD_DIM and q.stride(-1) == 1 and k_cache.is_contiguous()
            and torch.get_num_threads() == 1 and available())


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                    query_start_loc: torch.Tensor, block_tables: torch.Tensor, trees: torch.Tensor | None = None,
                    seen: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of N flattened tokens over their requests' paged caches.

    Args:
        q: (N, H, Dh) float32 or bfloat16 (the caches' dtype), last dimension contiguous (a view
            into the fused qkv is fine).
        k_cache, v_cache: (num_blocks, block_size, Hkv, Dh) float32 or bfloat16, contiguous.
        positions: (N,) int64, each token's position (it sees its request's slots 0..position).
        query_start_loc: (B + 1,) int64; block_tables: (B, width) int64, contiguous.
        trees, seen: None (every request causal), or `tree_tables`' two tensors: (B, 2) int64, the
            (base, length) of a request whose new tokens are a tree of drafts and (-1, 0) for the
            others; (N, width) uint8, token i's flags for the slots base..length-1 of its request.
    Returns:
        (N, H, Dh) in q's dtype (computed in float32; a bfloat16 result is rounded once at the end).
    """
    N, H, Dh = q.shape
    num_blocks, block_size, Hkv, _ = k_cache.shape
    if H % Hkv:
        raise ValueError(f"{H} query heads do not share {Hkv} key/value heads evenly")
    fns = _fn or _load()
    if not fns:
        raise RuntimeError(f"speclab's CPU attention kernel is not available: {_why}")
    if k_cache.dtype not in fns or q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q {q.dtype} and the caches {k_cache.dtype}/{v_cache.dtype} must share one dtype of "
                         f"{[str(d) for d in DTYPES]}: use llama.paged_attention, which falls back to torch")
    fn, dtype = fns[k_cache.dtype], q.dtype
    if dtype != torch.float32:
        q = q.float()  # (a copy of N * H * Dh floats: small beside the cache it reads)
    out = torch.empty(N, H, Dh, dtype=torch.float32)
    failed = fn(q.data_ptr(), q.stride(0), q.stride(1), k_cache.data_ptr(), v_cache.data_ptr(), num_blocks,
                block_tables.data_ptr(), block_tables.shape[1], query_start_loc.data_ptr(), positions.data_ptr(),
                out.data_ptr(), len(query_start_loc) - 1, H, Hkv, Dh, block_size, Dh ** -0.5,
                None if trees is None else trees.data_ptr(), None if seen is None else seen.data_ptr(),
                0 if seen is None else seen.shape[1])
    if failed:
        raise ValueError(BLOCK_ERROR)
    return out if dtype == torch.float32 else out.to(dtype)


def tree_tables(tree_masks, query_start_loc: list[int], seq_lens: list[int]):
    """The kernel's (trees, seen) for AttentionMetadata.tree_masks: None, or per request None (causal)
    or (base, mask (n_new, seq_len - base) bool), the slots from base on that each new token sees."""
    if not tree_masks or all(t is None for t in tree_masks):
        return None, None
    width = max(t[1].shape[1] for t in tree_masks if t is not None)
    trees = torch.tensor([[-1, 0]] * len(seq_lens), dtype=torch.long)
    seen = torch.zeros(query_start_loc[-1], width, dtype=torch.uint8)
    for b, tree in enumerate(tree_masks):
        if tree is not None:
            base, mask = tree
            if mask.shape != (query_start_loc[b + 1] - query_start_loc[b], seq_lens[b] - base):
                raise ValueError(f"request {b}'s tree mask is {tuple(mask.shape)}, not (its new tokens, its length "
                                 f"- base) = ({query_start_loc[b + 1] - query_start_loc[b]}, {seq_lens[b] - base})")
            trees[b] = torch.tensor([base, seq_lens[b]])
            seen[query_start_loc[b]:query_start_loc[b + 1], :mask.shape[1]] = mask.to(torch.uint8)
    return trees, seen
