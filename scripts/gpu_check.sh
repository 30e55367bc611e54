#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run (lesson 07's and 10's Triton kernels compiled for real):
#   bash scripts/gpu_check.sh [OUTDIR]
# 1. the kernel tests, the exercise's grader and the engine's tests with the kernels compiled for the
#    GPU (no interpreter): every check compares the kernels with the torch rules bit for bit on the GPU;
# 2. scripts/bench_kernel.py: both rules' kernels against the torch references, GB/s against the copy;
# 3. the vocabulary tile BLOCK_V swept for the largest batch.
# Runs with whatever torch and triton the machine has (it reports them) and reads speclab from this
# checkout. First run: an H200 on 2026-12-04 (torch 2.11, Triton 3.6), README "The kernel on a GPU".
set -uo pipefail
out=${1:-${OUT:-/tmp/speclab-gpu}}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
# kernels/ is installed as speclab.kernels (pyproject's package-dir): on a bare machine, install this
# checkout (editable, no dependencies: the machine's own torch and triton are used)
$py -c "import speclab.kernels" 2>/dev/null || $py -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
$py -c "import torch, triton, platform; print('python', platform.python_version(), 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee -a "$out/gpu.txt"
timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_07_kernel.py tests/test_10_block_kernel.py \
    tests/test_ex07_rejection_kernel.py tests/test_05_engine.py tests/test_10_typical.py tests/test_10_block.py \
    2>&1 | tee "$out/pytest.log" | tail -15
timeout 180 $py scripts/bench_kernel.py --json "$out/kernel_gpu.json" 2>&1 | tee "$out/bench.log"
timeout 90 $py - <<'PY' 2>&1 | tee "$out/block_v.log"
import torch, triton
from triton.testing import do_bench
from speclab.kernels import rejection_sample as K
B, k, V = 256, 5, 128256
drafts, ks, p, q, u, e = K._bench_inputs(B, k, V, "cuda")
print(f"BLOCK_V sweep, B={B} k={k} V={V}: kernels ms (median)")
for rule in ("standard", "block"):
    b = K.prepare_batch(drafts, ks, p, q, uniforms=u, noise=e)
    for block_v in (512, 1024, 2048, 4096, 8192):
        def run():
            b.out.fill_(-1)
            K._launch_all(b, block_v, rule)
        t = do_bench(run, return_mode="median")
        print(f"{rule:>8} BLOCK_V={block_v:>5}: {t:.3f} ms, {K._bytes_moved(b, rule) / t * 1e-6:.0f} GB/s")
PY
