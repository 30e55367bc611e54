"""Lesson 07's and 10's kernels compile for a real GPU, checked on a machine without one.

Triton's interpreter (how every other kernel test runs here) executes each program in Python and
never type-checks a branch or a loop-carried value, nor does it choose instructions. On the first
real GPU (an H200, 2026-12-04) that let two defects through: the block kernel did not compile (`tau`
int32 before its loop, int64 inside), and a float32 division compiled to the fast, inexact one.
Triton compiles for a named GPU on any machine (its front end, LLVM and the ptxas its wheel ships),
so this test does, in a process without TRITON_INTERPRET (tests/gpu_compile_probe.py), and reads
the PTX:
- every kernel variant (one-hot or not, float32 or float64) compiles for compute capability 9.0;
- every division is IEEE round-to-nearest (`div.rn`, as torch divides), never `div.full`/`div.approx`;
- the block kernel has no fused multiply-add (launched with enable_fp_fusion=False, so that
  rho * p - q rounds as in torch).
Controls, each of which must trip its check: a plain float32 `/` compiles to `div.full.f32`, a
kernel with the same type change as the old `tau` fails to compile, and the block kernel compiled
with fusion on has `fma.rn.f64`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def probe():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said out loud (it warns otherwise)
    run = subprocess.run([sys.executable, "-m", "tests.gpu_compile_probe"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the compile probe failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


def test_every_variant_compiles_for_a_gpu(probe):
    for dtype in ("fp32", "fp64"):
        names = sorted(name.split("(")[0] for name in probe["kernels"][dtype])
        assert names == sorted(["_greedy_kernel", "_accept_kernel", "_accept_kernel", "_end_token_kernel",
                                "_end_token_kernel", "_block_kernel", "_block_kernel"]), names


def test_every_division_is_ieee(probe):
    for dtype, kernels in probe["kernels"].items():
        for name, used in kernels.items():
            inexact = [op for op in used if op.startswith("div.") and not op.startswith("div.rn.")]
            assert not inexact, f"{name} ({dtype}) divides with {inexact}: torch rounds to nearest (tl.math.div_rn)"
    accept = probe["kernels"]["fp32"]["_accept_kernel(NO_DRAFT_PROBS=False)"]
    assert accept.get("div.rn.f32", 0) >= 1  # p / q is really divided (the check saw a division)


def test_the_block_kernel_fuses_no_multiply_add(probe):
    for dtype, kernels in probe["kernels"].items():
        for name, used in kernels.items():
            if name.startswith("_block_kernel"):
                assert not [op for op in used if op.startswith("fma.")], f"{name} ({dtype}) fuses: {used}"


def test_controls_trip_each_check(probe):
    assert "div.full.f32" in probe["plain_division"]  # what a kernel without div_rn gets
    assert "int64" in probe["type_change"] and "compiled" != probe["type_change"]
    assert probe["block_kernel_with_fusion"].get("fma.rn.f64", 0) > 0
