"""Benchmark lesson 07's Triton verification kernels against the torch reference.

    python scripts/bench_kernel.py [--json PATH]

On a CUDA GPU: triton.testing.do_bench (medians) for the standard rule's and lesson 10's block
rule's kernels at B in {1, 64, 256}, k = 5, V in {32000, 128256}, with GB/s against the measured
copy bandwidth, beside the torch references on the same GPU; --json writes the table. Without one: a short timing in Triton's CPU interpreter,
which checks that everything runs but is not a performance figure.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined

from speclab.kernels.rejection_sample import main  # noqa: E402

if __name__ == "__main__":
    main()
