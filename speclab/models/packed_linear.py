"""Projections at memory speed on a CPU: weights packed once, at load time, for oneDNN.

A decode step at batch 1 multiplies one activation row by every weight matrix of the model, so
its time is the time to read the weights (lesson 00's roofline). How fast that read goes depends
on the layout the GEMM library is handed. Measured on the course's 2-core AMD EPYC on 2026-11-29
(1 thread, torch 2.13, SmolLM2-135M's shapes, the host reading about 37 GB/s in a plain `sum`):
`F.linear` on the (out, in) weights ran at about 16 GB/s in float32 and 15 GB/s in bfloat16; the
same weights reordered once by oneDNN (`torch.ops.mkldnn._reorder_linear_weight`, what
torch.compile's CPU backend does to a frozen model) at 25-30 GB/s and 30-35 GB/s. On 2026-12-01
(`sum` at 20.4 GB/s, quiet) that one-row advantage did not reproduce: packed 12.8 GB/s, `F.linear`
13.8 GB/s, and the transposed layout below 17.5 GB/s.

The packing takes a batch-size hint, the number of rows oneDNN tunes the layout for. Tuned for 1
row, a forward over 2-9 rows (a speculative step verifying k drafts) ran 1.5-2.3x slower than the
same forward packed for 4 rows, while 1 row ran about as fast either way (`python -m
speclab.bench verify-cost`, and a sweep of SmolLM2's shapes over hints 1, 2, 4, 8, 16 at load 5-6).
So the default hint is 4 (SPECLAB_PACK_BATCH overrides it): verification is what this engine is for.

One row is the exception. A decode step multiplies one row by each weight, and for that product
the weight stored transposed, (in, out) contiguous, read by `torch.mm(x, W^T)` (MKL's GEMV streams it
once, in order) came closest to the read bandwidth of a plain `sum`: over SmolLM2's 30 layers of
projections, out of cache, 24.2 ms against 33.3 ms packed (for 4 rows or for 1) and 30.8 ms with
`F.linear` on the (out, in) weight: 17.5 against 12.8-13.8 GB/s, with `sum` at 20.4 GB/s (2026-12-01,
one thread, float32, load average 0.9). With 5 rows the same transposed product took 71.6 ms and the
4-row packing 44.3. So the model stores each weight transposed (`llama.fuse`: the modules' (out, in)
weights are views of it, no second copy), one row takes the GEMV and more rows the packed product.

Both are now the fallback for a decode or verify step. Where speclab's own kernel builds
(`speclab.models.cpu_gemm`: float32 or bfloat16, one torch thread, 1-16 rows), it takes those products: the
weight stays (out, in), each row streamed once, 28-35 ms for 1-5 rows over the same 30 layers where
the paths above took 28-30 ms for one row and 44-78 ms for five; and a row's result has the same
bits whatever the number of rows. More rows (a prompt's prefill, a batch's verify step) take the
packed product, which was 10-17 % faster than `F.linear` at 16-64 rows (2026-12-01).

The packed copy is a second copy of every weight (538 MB for float32 SmolLM2, as much as the model),
so where the kernel takes the few-row products it is made only once it pays: after PACK_AFTER calls
with 17-64 rows (the verify steps of a batch, where it was 11-28 % faster than `F.linear` under
load on 2026-12-02, and 10-17 % quiet on 2026-12-01), not for a prompt's prefill (a few calls; 5-16 %
at 96-192 rows, nothing at 256). Until then those calls take oneDNN's product on the plain (out, in) weight,
which needs no copy: on a Zen 5 EPYC (2026-12-07, one thread, float32, SmolLM2's four layer shapes) `F.linear`
(MKL) ran at 38-80 GFLOP/s from 17 to 241 rows, oneDNN on the plain weight at 73-176 and on the packed copy at
102-180, and a 12-prompt prefill of 2890 tokens took 9.45 s with `F.linear` and 4.72 s without it (MKL's
float32 GEMM ran no faster than with MKL_ENABLE_INSTRUCTIONS=AVX2, about the AVX2 peak of one core; oneDNN
picks AVX-512 by the CPU's features). A batch-1 run at one torch thread whose prompts are longer than 64 tokens
never holds the copy (`LLM("smollm2")` resident at 1.0 GB instead of 1.5; prompts of 17-64 tokens count as such
calls); lesson 00's sweep to batch 64 does (its kernel 0.5 GB higher after it), and so does a run at more threads,
whose few rows skip the one-thread kernel. bfloat16 follows the same rule (its few rows take the kernel's bfloat16
paths). Without the kernel, every product
beyond one float32 row takes the packed copy, which is made at once.

Packing changes speed, not the function: where oneDNN (or its bfloat16 support) is missing, on a
GPU, or with SPECLAB_PACKED_LINEAR=0, `PackedLinear` is `F.linear` on the plain weight for those rows (one
float32 row on a CPU still takes the transposed GEMV, which is the same product). The paths agree
within float rounding (they sum in a different order), as two GEMM libraries do.
"""

import os

import torch
import torch.nn.functional as F

from speclab.models import cpu_gemm

# oneDNN compiles a primitive per product shape and keeps up to 1024 of them, twice (its own cache and ideep's,
# ONEDNN_PRIMITIVE_CACHE_CAPACITY and LRU_CACHE_CAPACITY); every prompt length is a new shape for a prefill's
# products. With the default capacities `tests/test_10_tree.py` (tiny models of many shapes) peaked at 1.09 GB where
# F.linear had 0.78, and `make test`'s first phase at 4.48 GB; capped at 64 each, 0.77 GB, and a prefill of 55 prompt
# lengths twice took 20.8 / 18.5 s against 19.4 / 17.5 uncapped (2026-12-07, Zen 5). Set before oneDNN's first
# primitive; a value already in the environment wins. The names set here are listed in SPECLAB_SET_ENV, so that
# real vLLM's processes (`speclab.vllm_venv.subprocess_env`) run with their own defaults, not speclab's.
ONEDNN_CACHE = 64
for _var in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    if _var not in os.environ:
        os.environ[_var] = str(ONEDNN_CACHE)
        os.environ["SPECLAB_SET_ENV"] = ",".join(filter(None, [os.environ.get("SPECLAB_SET_ENV"), _var]))

PACKABLE = (torch.float32, torch.bfloat16)
PACK_BATCH = 4  # rows the packed layout is tuned for (see the module docstring)
PACK_AFTER = 8  # with the kernel: calls of 17..PACK_ROWS rows before the packed copy is made
PACK_ROWS = 64  # the most rows at which the packed product clearly beats F.linear (sweeps of 2026-12-01/02)


def pack_batch() -> int:
    """The batch-size hint for oneDNN's packing: SPECLAB_PACK_BATCH, else PACK_BATCH."""
    value = os.environ.get("SPECLAB_PACK_BATCH", str(PACK_BATCH))
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"SPECLAB_PACK_BATCH must be a positive integer (rows to tune for), got {value!r}")
    return int(value)


def packing_enabled(weight: torch.Tensor) -> bool:
    """Whether `weight` can be packed for oneDNN here (CPU, float32/bfloat16, not switched off)."""
    if os.environ.get("SPECLAB_PACKED_LINEAR", "1") == "0":
        return False
    if weight.device.type != "cpu" or weight.dtype not in PACKABLE or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    return weight.dtype != torch.bfloat16 or library_bf16()


def library_bf16() -> bool:
    """Whether torch's CPU GEMM libraries have bfloat16 kernels here (oneDNN: AVX512-BF16, AMX or AVX-VNNI);
    without them F.linear in bfloat16 is several times slower than in float32."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear:
    """y = x W^T without bias, W packed once for oneDNN when possible (see the module docstring).

    Args:
        weight: (out, in) plain weight. It is kept (the fallback path, and for inspection); the
            packed copy is derived from it (at once, or once it pays: the module docstring) and
            made again when the weight changes in place (its version counter moves, e.g. under
            load_state_dict).
    """

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self._prepare()

    def _prepare(self) -> None:
        self.packed, self._version, self.band_calls = None, self.weight._version, 0
        self.rows_t = self.weight.t().is_contiguous() and self.weight.device.type == "cpu"  # (in, out) storage
        self.few_rows = (self.weight.dtype in cpu_gemm.DTYPES and self.weight.device.type == "cpu"
                         and self.weight.stride(1) == 1 and cpu_gemm.available())  # (out, in) rows: the kernel
        self.packable = packing_enabled(self.weight)
        # bfloat16 where oneDNN has no bfloat16 kernels (AVX2 without AVX512-BF16 or AVX-VNNI): F.linear then took
        # 5-6x the few-row kernel's time at any row count (2026-12-06, Zen 3 EPYC, one thread, 3072 x 576: 17 rows
        # 6.2 against 1.0 ms, 40 rows 14.7 against 2.8, 128 rows 46.5 against 9.6; with two torch threads F.linear took
        # 3.7 / 7.2 / 22.9 ms against the one-thread kernel's 1.3 / 2.5 / 8.2), so the kernel takes every product
        self.kernel_always = self.few_rows and self.weight.dtype == torch.bfloat16 and not library_bf16()
        if self.packable and not self.few_rows:
            self._pack()

    def _pack(self) -> None:
        try:
            with torch.no_grad():
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach().contiguous(), pack_batch())
        except RuntimeError:  # an unsupported shape or build: the plain path is always right
            self.packable = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (N, in) -> (N, out)
        if self.weight._version != self._version:
            self._prepare()
        rows = x.shape[0]
        if self.few_rows and x.dtype == self.weight.dtype and (
                self.kernel_always or rows <= cpu_gemm.MAX_ROWS and torch.get_num_threads() == 1):
            return cpu_gemm.xwt(x, self.weight)  # a decode or verify step's few rows (cpu_gemm)
        if rows == 1 and self.rows_t and x.dtype == self.weight.dtype == torch.float32:
            return torch.mm(x, self.weight.t())  # one row over the transposed storage (module docstring)
        if self.packed is None and self.packable and rows <= PACK_ROWS:
            self.band_calls += 1                 # the kernel's case: pack once a batch's verify steps come
            if self.band_calls >= PACK_AFTER:
                self._pack()
        if x.dtype != self.weight.dtype or not self.packable:
            return F.linear(x, self.weight)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, None, "none", [], "")
        return self._plain_onednn(x)

    def _plain_onednn(self, x: torch.Tensor) -> torch.Tensor:
        """oneDNN's product on the plain (out, in) weight, no copy made (a prompt's prefill; the module
        docstring); F.linear from then on where oneDNN raises (a build or a layout it does not take)."""
        try:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight, None, "none", [], "")
        except RuntimeError:
            self.packable = False
            return F.linear(x, self.weight)

    @property
    def is_packed(self) -> bool:
        return self.packed is not None
