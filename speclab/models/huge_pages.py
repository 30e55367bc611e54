"""Weights in transparent huge pages: one 2 MB-aligned arena per model (Linux).

A decode step streams every weight once, 538 MB for SmolLM2 in float32. On 4 KB pages that read
crosses a page every 4 KB: a TLB miss and a page walk each time, and the hardware prefetchers stop
at every page edge. Linux backs memory with 2 MB pages where a program asks for them
(madvise(MADV_HUGEPAGE); most distributions set /sys/kernel/mm/transparent_hugepage/enabled to
"madvise", so torch's ordinary allocations get 4 KB pages). Measured on a 2-core AMD EPYC Zen 4
(one thread, 2026-12-04, load average about 1): summing a 256 MB array read 24.5 GB/s from
malloc'd memory and 33-34 GB/s from a huge-page mapping; a SmolLM2 float32 forward over 1 | 5 | 9
tokens took 27.8 | 28.5 | 41.3 ms with torch's allocations and 25.2 | 25.1 | 37.8 ms with its
weights in one huge-page arena, with the same logits bit for bit (the same kernel reads the same
values; only where they live changed).

`LlamaForCausalLM.prepare` places every fused weight in an `Arena` (`arena_for`). Elsewhere (not
Linux, no MADV_HUGEPAGE, or SPECLAB_HUGE_PAGES=0) nothing changes: `arena_for` returns None and the
weights stay where torch put them. `allocate` also serves `speclab.roofline`, so that the read
bandwidth a decode step is compared with is measured on the same kind of memory.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import torch

HUGE = 2 << 20  # bytes in a transparent huge page on x86-64 and most arm64 kernels
ALIGN = 64      # each tensor starts on a cache line


def enabled() -> bool:
    """Whether weights go into huge-page arenas here (Linux with MADV_HUGEPAGE, not switched off)."""
    if os.environ.get("SPECLAB_HUGE_PAGES", "1") == "0":
        return False
    return sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")


def allocate(nbytes: int) -> torch.Tensor:
    """A (nbytes,) uint8 tensor in a private anonymous mapping, 2 MB-aligned, advised for huge pages
    (when `enabled()`; plain pages otherwise). The tensor keeps its mapping alive; pages become
    resident as they are first written."""
    m = mmap.mmap(-1, max(nbytes, 1) + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if enabled():
        m.madvise(mmap.MADV_HUGEPAGE)
    buf = torch.frombuffer(m, dtype=torch.uint8)
    start = (-buf.data_ptr()) % HUGE
    return buf[start:start + nbytes]


class Arena:
    """A bump allocator over one huge-page mapping: `place(t)` returns a copy of `t` in it, with
    `t`'s layout (row-major, or row-major transposed as `fuse` stores some float32 weights)."""

    def __init__(self, nbytes: int):
        self.buffer = allocate(nbytes)
        self.used = 0

    def place(self, t: torch.Tensor) -> torch.Tensor:
        transposed = not t.is_contiguous() and t.dim() == 2 and t.t().is_contiguous()
        if not (t.is_contiguous() or transposed) or t.device.type != "cpu":
            raise ValueError(f"an arena holds contiguous CPU tensors (or their transposes), not {tuple(t.stride())} "
                             f"strides on {t.device}")
        n = t.numel() * t.element_size()
        if self.used + n > self.buffer.numel():
            raise ValueError(f"the arena has {self.buffer.numel() - self.used} bytes left, {n} asked: size it "
                             f"with arena_for() over every tensor it will hold")
        view = self.buffer[self.used:self.used + n].view(t.dtype)
        self.used += -(-n // ALIGN) * ALIGN
        out = view.view(t.t().shape).t() if transposed else view.view(t.shape)
        out.copy_(t)
        return out


def release_freed_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere). The
    weights a model fused into its arena were heap allocations, freed as they moved: without this the
    heap keeps their pages resident (measured: SmolLM2 in bfloat16 loaded after float32 kept 0.2 GB)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def arena_for(tensors) -> Arena | None:
    """An arena large enough for `tensors` (each rounded up to a cache line), or None where huge
    pages are not used."""
    if not enabled():
        return None
    return Arena(sum(-(-t.numel() * t.element_size() // ALIGN) * ALIGN for t in tensors))
