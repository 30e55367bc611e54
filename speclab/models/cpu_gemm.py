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

bfloat16 weights and activations take the same loop over half the bytes (`speclab_gemm_xwt_bf16`,
y rounded to bfloat16 as torch rounds), on the best of three paths the CPU has (`bf16_path`): AMX
tiles (Intel from Sapphire Rapids on; up to 16 rows, rows and K in multiples of 16 and 32), AVX512-BF16's
`vdpbf16ps` (Zen 4, Intel from Cooper Lake on), or each chunk of W widened to float32 (AVX2, NEON).
For 1-16 rows the path depends on the weight's shape and the CPU only, never on M, so the rows keep
their bits (more rows than AMX's tile of x holds take AVX512-BF16).
`python -m speclab.bench gemm` times SmolLM2's 121 products of a forward (2026-12-04, a 2-core Intel
Xeon with AVX-512, AVX512-BF16 and AMX, one thread, load average 0.2-0.5, medians of 7 interleaved
rounds, ms for 1 | 5 | 9 rows): float32 kernel 34.9 | 37.6 | 46.1, oneDNN packed 41.5 | 44.4 | 51.9;
bfloat16 on AMX 20.2 | 20.5 | 21.8 (18.5 | 19.3 in a second run), AVX512-BF16 17.9 | 24.8 | 36.8,
widened 21.6 | 26.1 | 39.7, oneDNN packed 24.7 | 24.7 | 25.0 and `F.linear` 33.2 | 37.2 | 38.0. AMX's
tiles multiply 16 rows of W by up to 16 of x in one instruction, and five rows cost what one does.
Those AVX512-BF16 figures were read as the instruction's arithmetic (about 1.9 G a second in a
register-only loop there); on a Zen 4 most of the cost turned out to be the tail, each of the M * N
sums having its 16 lanes stored and added back as scalars. Added in registers (the same tree, the
same bits), on a 2-core Zen 4 EPYC with AVX512-BF16 and no AMX (2026-12-04, `bench gemm` at 16:52
and 16:59 UTC, load average 0.4-0.7, 5 interleaved rounds, medians), AVX512-BF16 went from 14.3 | 20.3 | 37.2 to 15.1 | 14.0 | 21.8 ms
(oneDNN packed 20.9 | 21.9 | 23.2 in the same run), so five rows cost what one does on that path
too; the float32 kernel, with AVX-512's 32 registers holding larger tiles, 9 rows 55.5 -> 41.5 ms
(and 7 rows 52.9 -> 31.8) in a standalone harness of the same products (3 interleaved runs, medians,
load average 0.5-0.8). The Xeon was not re-measured.

On AVX2 (a Zen 3 EPYC, 2026-12-03, one thread, load average 0.7-1.1, medians of 9 interleaved rounds) five rows still cost 1.18-1.21x one row over SmolLM2's
projections, and the weight's layout is what moves that, not the arithmetic. Keeping each x chunk in a
register and reducing eight sums at once with shuffles made five rows 20-25 % faster from L2 (the
arithmetic alone went from 72 to 96 % of the core's 93 GFLOP/s at K = 576) but 3-11 % slower streamed
from memory.
Rows of W stored interleaved per tile ([K/8][2][8]: one sequential stream) took five rows to
1.05-1.07x one row, in two runs. That layout cannot be a strided view of the (out, in) weight the
modules own, so it waits for a design that keeps one copy (the prefill would have to read it too).
Two cheaper tries on the same Zen 3 (2026-12-05, one thread, load average 0.2-0.7, standalone harness
over the projections, medians of interleaved rounds) left the kernel as it is. Prefetching each
of a tile's rows along its own stream, instead of the tile's block in memory order, made five and six
rows 3-7 % and 8-12 % faster but four, seven and nine rows up to 7 % slower (four runs). A k-major
layout of 16-row panels (x broadcast, no reduction) made one row 13 % faster but five rows no faster
than now (one run), and it is no view of the modules' weights either. Later that day (23:52-23:57 UTC,
load average 0.1-0.5, medians of 9 interleaved rounds over the projections and the LM head in huge
pages) the paired layout was built into this kernel's own tiles (the same sums in the same order:
the same bits as row-major for 1-16 rows) and timed against it in the same rounds: four rows took
0.76-0.90x as long, five 0.90-1.00x, one to three rows and seven or nine no less (four runs). The
1.05-1.07x above did not reproduce, and four rows alone do not pay for a second copy of the weights
(425 MB), so neither layout change is shipped. Other tile shapes (one row of W against 2-6 rows of x;
blocks of at most 3 or 4 rows of x for 5-9 rows) and copying each tile's rows into a buffer before
its products made nothing faster (two runs each). On 2026-12-06 (the same kind of Zen 3, one thread, another
job paused during each run, a harness over the 121 products of a forward on huge pages, medians of 9-15
interleaved rounds) one row took 26.5 ms, and 2 / 3 / 4 / 5 rows 29.1 / 30.2 / 27.7 / 34.1: four rows
cheaper than three. Prefetching 8 or 32 KB ahead instead of 16, or with the non-temporal or L3 hint,
moved no row count by more than the noise (1 ms); two or three rows computed as four (the extra rows
zero, their sums not stored) read 3-5 % faster in one run and 8 % slower in the next, and five rows
slower in both. Nothing of it is shipped.
"""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path

import torch

from speclab.models import native

SOURCE = Path(__file__).with_name("cpu_gemm.cpp")
DTYPES = (torch.float32, torch.bfloat16)  # x and W of one of these; y in the same
MAX_ROWS = 16  # beyond this the libraries' blocked GEMMs are as fast (a sweep of 1-32 rows). On the AVX2 Zen 3
# (2026-12-03, SmolLM2's projections streamed, two sweeps of 7 interleaved rounds beside another job) the kernel
# was 17-30 % faster than oneDNN's packed product at 17 rows, 0-13 % at 24, within 4 % at 32 and 6-10 % slower at
# 40 (a batch of 8 verifying 4 drafts): moving the limit to 24 would gain little, so it stays.

_lib = None   # the loaded float32 entry point, False once loading failed
_bf16 = {}    # the bfloat16 entry points, by BF16_PATHS' names, and "which" (the path a shape takes)
# The bfloat16 product's entry points (the .cpp's header): the machine's best (AMX where it applies,
# else AVX512-BF16, else widened to float32), and the two below it, which tests call on a CPU that has more.
BF16_PATHS = {"best": "speclab_gemm_xwt_bf16", "avx512_bf16": "speclab_gemm_xwt_bf16_dot",
              "widened": "speclab_gemm_xwt_bf16_widened"}
_why = ""     # why it is not available, for the warning and for tests
ARGS = [ctypes.c_void_p, ctypes.c_long] * 3 + [ctypes.c_long] * 3  # x, ldx, w, ldw, y, ldy, M, N, K


def _load():
    global _lib, _why
    if _lib is not None:
        return _lib
    fn, _why = native.load(SOURCE, "speclab_gemm_xwt", ARGS, None, "SPECLAB_CPU_GEMM")
    if fn:  # the same build: these symbols are there whenever the first is
        for path in BF16_PATHS:
            _bf16[path] = native.load(SOURCE, BF16_PATHS[path], ARGS, None, "SPECLAB_CPU_GEMM")[0]
        _bf16["which"] = native.load(SOURCE, "speclab_gemm_bf16_path", [ctypes.c_long] * 3, ctypes.c_int,
                                     "SPECLAB_CPU_GEMM")[0]
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


def bf16_path(m: int, n: int, k: int) -> str:
    """The instructions the bfloat16 product of an (m, k) x and an (n, k) weight takes here: "amx",
    "avx512_bf16" or "widened" (each weight chunk widened to float32)."""
    if not _load():
        raise RuntimeError(f"speclab's CPU kernel is not available: {_why}")
    return ("widened", "avx512_bf16", "amx")[_bf16["which"](m, n, k)]


def entry_point(dtype: torch.dtype, path: str = "best"):
    """The C function `xwt` calls for weights of `dtype` (float32, or bfloat16 on `path`)."""
    fn = _lib or _load()
    if not fn:
        raise RuntimeError(f"speclab's CPU kernel is not available: {_why}")
    return _bf16[path] if dtype == torch.bfloat16 else fn


def linear(x: torch.Tensor, weight: torch.Tensor, path: str = "best") -> torch.Tensor:
    """x W^T for a (M, K) x and a (N, K) weight with contiguous rows, both float32 or both bfloat16,
    on the CPU, through the kernel (any M), with a clear error for anything else. y has their dtype.
    `path` picks one of BF16_PATHS for bfloat16 (tests take each on a CPU that has them)."""
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and the weight {tuple(weight.shape)} are not (M, K) and (N, K)")
    if (x.dtype != weight.dtype or x.dtype not in DTYPES or x.device.type != "cpu"
            or weight.device.type != "cpu"):
        raise ValueError(f"the kernel takes float32 or bfloat16 CPU tensors of one dtype, not {x.dtype}/"
                         f"{weight.dtype} on {x.device}/{weight.device}: use F.linear")
    if weight.stride(1) != 1:
        raise ValueError("the weight's rows must be contiguous (weight.stride(1) == 1): pass weight.contiguous()")
    if path not in BF16_PATHS:
        raise ValueError(f"path must be one of {sorted(BF16_PATHS)}, got {path!r}")
    return xwt(x, weight, path)


def xwt(x: torch.Tensor, weight: torch.Tensor, path: str = "best") -> torch.Tensor:
    """`linear` without its checks, for a caller that made them once (`PackedLinear`, per weight):
    a decode step calls it about 120 times, and the checks cost more than a small layer's product."""
    if x.stride(1) != 1:
        x = x.contiguous()
    fn = _lib or _load()
    if not fn:
        raise RuntimeError(f"speclab's CPU kernel is not available: {_why}")
    if weight.dtype == torch.bfloat16:
        fn = _bf16[path]
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=weight.dtype)
    fn(x.data_ptr(), x.stride(0), weight.data_ptr(), weight.stride(0), y.data_ptr(), n, m, n, k)
    return y
