"""Compiles lesson 07's and 10's kernels for a CUDA GPU with none present, for tests/test_07_kernel_compiles.py.

    python -m tests.gpu_compile_probe      (in a process WITHOUT TRITON_INTERPRET=1)

Prints one JSON object: what each kernel variant's PTX divides and fuses with, and three controls
that show the checks can fail (a plain float32 `/`, a type change across a loop, the block kernel
compiled with FMA fusion on). {"skip": reason} where Triton has no CUDA backend to compile with.
"""

import json
import os
import sys

if os.environ.get("TRITON_INTERPRET"):
    sys.exit("run without TRITON_INTERPRET=1: the kernels must be compiled, not interpreted")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.errors import CompilationError  # noqa: E402

from speclab.kernels import rejection_sample as kernels  # noqa: E402


@triton.jit
def _type_change(k_ptr, out_ptr):  # control: tau int32 before the loop, int64 inside (k is int64)
    k = tl.load(k_ptr)
    tau = 0
    for i in range(0, k):
        if i > 2:
            tau = i + 1
    tl.store(out_ptr, tau)


def main():
    target = GPUTarget("cuda", 90, 32)
    try:
        plain = kernels.plain_division_ptx()
    except Exception as err:  # noqa: BLE001 - no CUDA backend or ptxas: nothing to check here
        print(json.dumps({"skip": f"Triton cannot compile for a CUDA GPU here ({type(err).__name__}: {err})"}))
        return
    ins = kernels.ptx_instructions
    out = {"kernels": {dtype: {name: ins(ptx) for name, ptx in kernels.compile_for_gpu(dtype).items()}
                       for dtype in ("fp32", "fp64")}}
    out["plain_division"] = ins(plain)
    try:
        triton.compile(ASTSource(_type_change, {"k_ptr": "*i64", "out_ptr": "*i64"}), target=target)
        out["type_change"] = "compiled"
    except CompilationError as err:
        out["type_change"] = str(err).strip().splitlines()[-1]
    signature = {arg: "constexpr" if arg in ("NO_DRAFT_PROBS", "BLOCK_V") else
                 kernels._POINTERS.get(arg, "*fp32") if arg.endswith("_ptr") else "i32"
                 for arg in kernels._block_kernel.arg_names}
    fused = triton.compile(ASTSource(kernels._block_kernel, signature, {"NO_DRAFT_PROBS": False, "BLOCK_V": 2048}),
                           target=target, options={"enable_fp_fusion": True})
    out["block_kernel_with_fusion"] = ins(fused.asm["ptx"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
