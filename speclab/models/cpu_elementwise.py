"""A decoder layer's elementwise work on a CPU in one pass each: RMSNorm, RoPE + cache write, SwiGLU.

A decode step of SmolLM2 spends most of its time reading weights (the projections, `cpu_gemm`), but
between them torch runs about twenty small ops per layer (F.rms_norm decomposes into six, RoPE is
a slice, a negation, a concatenation, two multiplies and an add, then two `index_copy_` into the
cache, then SiLU, a chunk and a multiply), each a few µs of dispatch for a few hundred floats.
`cpu_elementwise.cpp` does each group in one call (the .cpp says how, and how exact).

Where it runs: float32 or bfloat16 CPU tensors (all of one dtype), no autograd (training a head keeps
torch's ops, which have gradients), contiguous last dimensions. In bfloat16 it rounds where torch's
bfloat16 ops round (the .cpp says where), so RoPE gives torch's bits there too. Built like `cpu_gemm` (`speclab.models.native`);
SPECLAB_CPU_ELEMENTWISE=0 turns it off, and without a compiler `available()` is False (cpu_gemm's
warning says so) and the layers take torch's ops: the same function within float32 rounding.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from speclab.models import native

SOURCE = Path(__file__).with_name("cpu_elementwise.cpp")
MAX_HEAD_DIM = 512  # the .cpp's per-head scratch

_fns = None  # {name: the loaded function}, False once loading failed
_why = ""


def _load():
    global _fns, _why
    if _fns is None:
        p, n = ctypes.c_void_p, ctypes.c_long
        signatures = {"speclab_rms_norm": ([p, n, p, p, n, n, ctypes.c_float], None),
                      "speclab_rope_cache": ([p, n, p, p, p, p, p, n, n, n, n, n], ctypes.c_int),
                      "speclab_silu_mul": ([p, n, p, n, n], None)}
        signatures.update({f"{name}_bf16": sig for name, sig in signatures.items()})  # the same, bfloat16
        fns = {}
        for symbol, (args, restype) in signatures.items():
            fns[symbol], _why = native.load(SOURCE, symbol, args, restype, "SPECLAB_CPU_ELEMENTWISE")
            if fns[symbol] is None:
                break
        _fns = fns if all(fns.values()) and len(fns) == len(signatures) else False
    return _fns


def available() -> bool:
    """Whether the kernels are built and loaded here (building them on first call)."""
    return bool(_load())


def why_unavailable() -> str:
    """Why `available()` is False ('' when it is True)."""
    _load()
    return _why


def applies(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these tensors: float32 or bfloat16 (all one dtype) on a CPU, rows
    contiguous, no autograd.
    (Called about 120 times a forward, so it reads attributes that cost no allocation: `is_cpu`,
    not `device.type`; it cost 6 µs a call written with a generator over `device.type`, 1.3 µs now:
    timeit, one thread, 2026-12-03's Zen 3 EPYC, load average about 1.)"""
    if torch.is_grad_enabled() or not (_fns or available()):
        return False
    dtype = tensors[0].dtype
    if dtype is not torch.float32 and dtype is not torch.bfloat16:
        return False
    for t in tensors:
        if not t.is_cpu or t.dtype is not dtype or t.stride(-1) != 1:
            return False
    return True


SLOT_ERROR = ("a slot in slot_mapping lies outside the KV cache's {num_slots} slots: the scheduler must allocate "
              "blocks before the forward")


def entry_point(symbol: str, dtype: torch.dtype):
    """The entry point `symbol` for float32 or bfloat16 tensors (a clear error for another dtype)."""
    fns = _fns or _load()
    if not fns:
        raise RuntimeError(f"speclab's elementwise CPU kernels are not available: {_why}")
    if dtype not in SUFFIX:
        raise ValueError(f"the elementwise kernels take float32 or bfloat16 tensors, not {dtype}: use torch's ops")
    return fns[symbol + SUFFIX[dtype]]


SUFFIX = {torch.float32: "", torch.bfloat16: "_bf16"}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2, -1) + eps) * weight for (N, D) x and (D,) weight; a new (N, D) tensor."""
    rows, d = x.shape
    if weight.dtype != x.dtype:
        raise ValueError(f"x is {x.dtype} and the weight {weight.dtype}: the kernel takes one dtype")
    out = torch.empty(rows, d, dtype=x.dtype)
    entry_point("speclab_rms_norm", x.dtype)(x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), rows, d, eps)
    return out


def rope_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int, kv_heads: int) -> None:
    """Rotate q's and k's heads of `qkv` in place and write each row's k and v into its cache slot.

    Args:
        qkv: (N, (H + 2 Hkv) Dh) fused projection output, q's heads first, then k's, then v's.
        cos, sin: (N, 1, Dh) contiguous tables at the rows' positions (`llama.rope_tables`).
        slot_mapping: (N,) int64 cache slots.
        k_cache, v_cache: (num_blocks, block_size, Hkv, Dh) contiguous, all five of qkv's dtype.
    """
    rows, dh = qkv.shape[0], k_cache.shape[-1]
    if dh > MAX_HEAD_DIM or not (cos.is_contiguous() and sin.is_contiguous() and k_cache.is_contiguous()
                                 and v_cache.is_contiguous()):
        raise ValueError(f"rope_cache takes contiguous tables and caches and head_dim <= {MAX_HEAD_DIM}: "
                         "use llama.rotate and index_copy_")
    if not qkv.dtype == cos.dtype == sin.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(f"rope_cache takes one dtype, not qkv {qkv.dtype}, tables {cos.dtype}/{sin.dtype} and "
                         f"caches {k_cache.dtype}/{v_cache.dtype}: build the tables in qkv's dtype (meta.rope)")
    slots = slot_mapping if slot_mapping.dtype == torch.long and slot_mapping.is_contiguous() \
        else slot_mapping.to(torch.long).contiguous()
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    fn = entry_point("speclab_rope_cache", qkv.dtype)
    if fn(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), k_cache.data_ptr(),
          v_cache.data_ptr(), num_slots, rows, heads, kv_heads, dh):
        raise IndexError(SLOT_ERROR.format(num_slots=num_slots))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for (N, 2 I) rows holding gate then up; a new (N, I) tensor."""
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2, dtype=gate_up.dtype)
    fn = entry_point("speclab_silu_mul", gate_up.dtype)
    fn(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), rows, width // 2)
    return out
