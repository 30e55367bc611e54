"""The few-row product of a decode or verify step, `x W^T`, in a small kernel of our own.

A speculative step verifies k + 1 tokens, so its projections multiply 2-10 rows by each weight.
That product should cost what one row costs, reading the weight once (lesson 00's roofline), but
the CPU GEMM libraries in torch do not manage it: on SmolLM2's 30 layers (one thread, 2026-12-01)
five rows took 44-50 ms through oneDNN's packed layout and 66-78 ms through MKL, against 28-30 ms
for one row. `cpu_gemm.cpp` streams each weight row once, computes its dot products with up to 6
rows of x in registers, reuses the row from the L1 cache for the next 6 and prefetches ahead: five
rows take 33-34 ms, nine 42 (`python -m speclab.bench verify-cost` shows the whole forward).

The kernel also sums every output in one fixed order, whatever the number of rows: a row's
projections are bit for bit the same in a one-row decode step and in a nine-row verify step, so
speculation cannot change a greedy token through rounding in them (a GEMM library picks its
summation order per shape). Larger products (a prompt's prefill) stay with the library.

It is C++ built once per machine with the host's compiler (`c++ -O3 -march=native`, or $CXX)
into speclab's cache (`$SPECLAB_CACHE/cpu_gemm/`), and loaded with ctypes (`speclab.models.native`):
no torch headers, a build of about a second. Where there is no compiler, or the build fails, or SPECLAB_CPU_GEMM=0,
`available()` is False and the projections take the libraries' paths (a warning says why, except
for the switch).
The kernel is single-threaded: with more than one torch thread the libraries, which use them all,
run instead (`PackedLinear`).

On AVX2 (a Zen 3 EPYC, 2026-12-03, one thread, load average 0.7-1.1, medians of 9 interleaved rounds) five rows still cost 1.18-1.21x one row over SmolLM2's
projections, and the weight's layout is what moves that, not the arithmetic. Keeping each x chunk in a
register and reducing eight sums at once with shuffles made five rows 20-25 % faster from L2 (the
arithmetic alone went from 72 to 96 % of the core's 93 GFLOP/s at K = 576) but 3-11 % slower streamed
from memory.
Rows of W stored interleaved per tile ([K/8][2][8]: one sequential stream) took five rows to
1.05-1.07x one row, in two runs. That layout cannot be a strided view of the (out, in) weight the
modules own, so it waits for a design that keeps one copy (the prefill would have to read it too).
"""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path

import torch

from speclab.models import native

SOURCE = Path(__file__).with_name("cpu_gemm.cpp")
MAX_ROWS = 16  # beyond this the libraries' blocked GEMMs are as fast (a sweep of 1-32 rows). On the AVX2 Zen 3
# (2026-12-03, SmolLM2's projections streamed, two sweeps of 7 interleaved rounds beside another job) the kernel
# was 17-30 % faster than oneDNN's packed product at 17 rows, 0-13 % at 24, within 4 % at 32 and 6-10 % slower at
# 40 (a batch of 8 verifying 4 drafts): moving the limit to 24 would gain little, so it stays.

_lib = None   # the loaded library, False once loading failed
_why = ""     # why it is not available, for the warning and for tests


def _load():
    global _lib, _why
    if _lib is not None:
        return _lib
    fn, _why = native.load(SOURCE, "speclab_gemm_xwt", [ctypes.c_void_p, ctypes.c_long] * 3 + [ctypes.c_long] * 3,
                           None, "SPECLAB_CPU_GEMM")
    _lib = fn or False
    if _lib is False and _why != "SPECLAB_CPU_GEMM=0":  # (not for the switch: whoever set it knows)
        warnings.warn(f"speclab's few-row CPU kernel is not available ({_why}); projections use torch's "
                      "GEMM libraries, which verify several tokens more slowly", RuntimeWarning, stacklevel=3)
    return _lib


def available() -> bool:
    """Whether the kernel is built and loaded here (building it on first call)."""
    return bool(_load())


def why_unavailable() -> str:
    """Why `available()` is False ('' when it is True)."""
    _load()
    return _why


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T for a (M, K) float32 x and a (N, K) float32 weight with contiguous rows, on the CPU,
    through the kernel (any M), with a clear error for anything else."""
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and the weight {tuple(weight.shape)} are not (M, K) and (N, K)")
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu" or weight.device.type != "cpu":
        raise ValueError(f"the kernel takes float32 CPU tensors, not {x.dtype}/{weight.dtype} on "
                         f"{x.device}/{weight.device}: use F.linear")
    if weight.stride(1) != 1:
        raise ValueError("the weight's rows must be contiguous (weight.stride(1) == 1): pass weight.contiguous()")
    return xwt(x, weight)


def xwt(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`linear` without its checks, for a caller that made them once (`PackedLinear`, per weight):
    a decode step calls it about 120 times, and the checks cost more than a small layer's product."""
    if x.stride(1) != 1:
        x = x.contiguous()
    fn = _lib or _load()
    if not fn:
        raise RuntimeError(f"speclab's CPU kernel is not available: {_why}")
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    fn(x.data_ptr(), x.stride(0), weight.data_ptr(), weight.stride(0), y.data_ptr(), n, m, n, k)
    return y
