"""The few-row CPU kernel (speclab.models.cpu_gemm): the product it claims, the same bits for a
row whatever the number of rows, in float32 and in bfloat16 on each of its bfloat16 paths (AMX,
AVX512-BF16, widened: all three are called on every CPU, a path the CPU lacks falling back to the
one below it), and a clear fallback when it cannot be built."""

import os
import subprocess
import sys

import pytest
import torch

from speclab.models import cpu_gemm
from speclab.models.packed_linear import PackedLinear

needs_kernel = pytest.mark.skipif(not cpu_gemm.available(), reason=f"kernel not built: {cpu_gemm.why_unavailable()}")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def reference(x, w):
    return (x.double() @ w.double().t()).float()


@needs_kernel
@pytest.mark.parametrize("n,k", [(96, 40), (97, 576), (13, 7), (960, 576), (6, 1536), (5, 8), (1, 3)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16])
def test_kernel_computes_x_w_transposed(m, n, k):
    """Every tile shape (rows of W per tile 6/4/3/2/1 with 1-6 rows of x a block on 16 vector
    registers; 8/6/5/4/3/1 with 1-9 on AVX-512's 32) and the tails (n not a multiple of the tile,
    k not a multiple of 8) against a float64 product."""
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    w, x = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g)
    torch.testing.assert_close(cpu_gemm.linear(x, w), reference(x, w), rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_kernel
def test_kernel_reads_strided_rows_of_x_and_w():
    g = torch.Generator().manual_seed(1)
    big_x, big_w = torch.randn(5, 300, generator=g), torch.randn(64, 300, generator=g)
    x, w = big_x[:, 10:210], big_w[::2, 20:220]   # row strides 300 and 600, rows contiguous
    torch.testing.assert_close(cpu_gemm.linear(x, w), reference(x, w), rtol=1e-5, atol=1e-4)
    xt = torch.randn(200, 5, generator=g).t()     # columns strided: copied, not misread
    torch.testing.assert_close(cpu_gemm.linear(xt, w), reference(xt, w), rtol=1e-5, atol=1e-4)


BF16_SHAPES = [(64, 576), (960, 576), (48, 1536), (97, 576), (16, 40), (13, 7), (5, 8), (1, 3)]


@needs_kernel
@pytest.mark.parametrize("path", sorted(cpu_gemm.BF16_PATHS))
@pytest.mark.parametrize("n,k", BF16_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 9, 16])
def test_bfloat16_kernel_computes_x_w_transposed(path, m, n, k):
    """bfloat16 x and W (the AMX tiles where n % 16 == 0 and k % 32 == 0, the AVX512-BF16 tiles and
    their tails elsewhere) against a float64 product of the same bfloat16 values: y is that product
    rounded to bfloat16 (half an ulp) after a float32 sum, whose rounding is bounded by the terms'
    magnitudes (2^-16 of them: far above a float32 sum's error in any order over K <= 1536, far below
    one term left out or counted twice, 1/K of them)."""
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    w, x = torch.randn(n, k, generator=g).bfloat16(), torch.randn(m, k, generator=g).bfloat16()
    y, exact = cpu_gemm.linear(x, w, path=path), x.double() @ w.double().t()
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    terms = x.double().abs() @ w.double().abs().t()  # what a float32 sum's rounding scales with
    assert ((y.double() - exact).abs() <= exact.abs() * 2 ** -8 + terms * 2 ** -16 + 1e-30).all()


@needs_kernel
@pytest.mark.parametrize("path", sorted(cpu_gemm.BF16_PATHS))
def test_a_bfloat16_row_gets_the_same_bits_in_a_decode_step_and_a_verify_step(path):
    g = torch.Generator().manual_seed(6)
    for n, k in [(960, 576), (576, 1536), (99, 37), (64, 64)]:
        w, x = torch.randn(n, k, generator=g).bfloat16(), torch.randn(16, k, generator=g).bfloat16()
        assert rows_invariant(lambda x, w: cpu_gemm.linear(x, w, path=path), w, x)


@needs_kernel
def test_the_bfloat16_paths_are_the_cpu_s():
    """AMX where the CPU has it and the shape fits its tiles, else AVX512-BF16 where it has that."""
    from speclab.cpu_info import cpu_name
    isa = cpu_name()
    vector = "avx512_bf16" if "AVX512-BF16" in isa else "widened"
    assert cpu_gemm.bf16_path(5, 97, 576) == vector and cpu_gemm.bf16_path(5, 960, 40) == vector
    assert cpu_gemm.bf16_path(17, 960, 576) == vector   # more rows than a tile of x holds
    assert cpu_gemm.bf16_path(16, 960, 576) == ("amx" if "AMX" in isa else vector)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_rows_give_an_empty_product(dtype):
    """A (0, K) x (it once divided by its zero blocks and killed the process) and a (0, K) weight."""
    w = torch.ones(64, 32, dtype=dtype)
    assert cpu_gemm.linear(torch.ones(0, 32, dtype=dtype), w).shape == (0, 64)
    assert cpu_gemm.linear(torch.ones(3, 32, dtype=dtype), w[:0]).shape == (3, 0)


@needs_kernel
def test_bad_input_is_refused_with_the_fix_not_misread():
    w = torch.randn(8, 4)
    with pytest.raises(ValueError, match="float32 or bfloat16 CPU"):
        cpu_gemm.linear(torch.ones(2, 4, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="of one dtype"):
        cpu_gemm.linear(torch.ones(2, 4, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="path must be one of"):
        cpu_gemm.linear(torch.ones(2, 4), w, path="amx")
    with pytest.raises(ValueError, match="stride"):
        cpu_gemm.linear(torch.ones(2, 8), torch.randn(8, 8).t())
    with pytest.raises(ValueError, match=r"\(M, K\) and \(N, K\)"):
        cpu_gemm.linear(torch.ones(2, 5), w)


def rows_invariant(linear, w, x) -> bool:
    """Whether each row of x gives the same bits alone and inside every larger batch."""
    alone = [linear(x[i:i + 1], w) for i in range(x.shape[0])]
    return all(torch.equal(linear(x[:m], w)[i], alone[i][0]) for m in range(2, x.shape[0] + 1) for i in range(m))


@needs_kernel
def test_a_row_gets_the_same_bits_in_a_decode_step_and_a_verify_step():
    g = torch.Generator().manual_seed(2)
    for n, k in [(960, 576), (576, 1536), (99, 37)]:
        w, x = torch.randn(n, k, generator=g), torch.randn(16, k, generator=g)
        assert rows_invariant(cpu_gemm.linear, w, x)


def test_the_invariance_check_can_fail():
    """Negative control: a product whose summation order depends on the number of rows (the second
    half of k summed first when there are several rows) must be caught by the check above."""
    def order_depends_on_rows(x, w):
        if x.shape[0] == 1:
            return x @ w.t()
        h = x.shape[1] // 2
        return x[:, h:] @ w[:, h:].t() + x[:, :h] @ w[:, :h].t()
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(64, 576, generator=g), torch.randn(6, 576, generator=g)
    assert not rows_invariant(order_depends_on_rows, w, x)


@needs_kernel
def test_packed_linear_takes_the_kernel_for_few_rows_only():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(96, 64, generator=g)
    lin = PackedLinear(w)
    assert lin.few_rows
    x = torch.randn(cpu_gemm.MAX_ROWS + 1, 64, generator=g)
    assert torch.equal(lin(x[:5]), cpu_gemm.linear(x[:5], w))
    torch.testing.assert_close(lin(x), reference(x, w), rtol=1e-5, atol=1e-4)   # the library's path
    torch.set_num_threads(2)                                                    # the kernel is one thread
    torch.testing.assert_close(lin(x[:5]), reference(x[:5], w), rtol=1e-5, atol=1e-4)
    torch.set_num_threads(1)
    lin16, x16 = PackedLinear(w.bfloat16()), x.bfloat16()
    assert lin16.few_rows and torch.equal(lin16(x16[:5]), cpu_gemm.linear(x16[:5], w.bfloat16()))
    assert lin16(x16).dtype == torch.bfloat16                                    # 17 rows: the library's path
    torch.testing.assert_close(lin16(x16).float(), reference(x16.float(), w.bfloat16().float()), rtol=2e-2, atol=2e-2)


@needs_kernel
def test_the_packed_copy_is_made_only_once_a_batch_s_verify_steps_need_it():
    """With the kernel, a weight's packed copy (as large as the weight) waits for PACK_AFTER calls of
    17..PACK_ROWS rows; prefill-sized calls and the kernel's own never make it, in float32 and bfloat16."""
    from speclab.models import packed_linear as P
    g = torch.Generator().manual_seed(5)
    w = torch.randn(96, 64, generator=g)
    lin = PackedLinear(w)
    if not P.packing_enabled(w):
        pytest.skip("oneDNN packing is not available in this torch build")
    assert not lin.is_packed
    for rows in (1, 5, cpu_gemm.MAX_ROWS, P.PACK_ROWS + 1, 200) * P.PACK_AFTER:  # decode, verify, prefill
        x = torch.randn(rows, 64, generator=g)
        torch.testing.assert_close(lin(x), reference(x, w), rtol=1e-5, atol=1e-4)
    assert not lin.is_packed, "calls the packed copy does not speed up made it"
    x = torch.randn(40, 64, generator=g)
    for i in range(P.PACK_AFTER):
        assert not lin.is_packed, f"packed after {i} calls of 40 rows, before PACK_AFTER = {P.PACK_AFTER}"
        torch.testing.assert_close(lin(x), reference(x, w), rtol=1e-5, atol=1e-4)
    assert lin.is_packed
    torch.testing.assert_close(lin(x), reference(x, w), rtol=1e-5, atol=1e-4)     # the packed product
    w16 = w.bfloat16()
    lin16 = PackedLinear(w16)
    for _ in range(P.PACK_AFTER - 1):
        lin16(torch.randn(40, 64, generator=g).bfloat16())
    assert not lin16.is_packed
    lin16(torch.randn(40, 64, generator=g).bfloat16())
    assert lin16.is_packed == P.packing_enabled(w16)


SCRIPT = """
import warnings, torch
warnings.simplefilter("error", RuntimeWarning)
from speclab.models import cpu_gemm
try:
    cpu_gemm.available()
except RuntimeWarning as e:
    print("WARNED:", e)
from speclab.models.packed_linear import PackedLinear
w = torch.randn(8, 4)
print("few_rows", PackedLinear(w).few_rows, float((PackedLinear(w)(torch.ones(2, 4)) - w.sum(1)).abs().max()) < 1e-5)
"""


def run_without_kernel(tmp_path, **env) -> str:
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SPECLAB_CACHE": str(tmp_path), **env}).stdout


def test_a_failing_build_falls_back_with_a_warning_naming_the_cause(tmp_path):
    out = run_without_kernel(tmp_path, CXX="/bin/false")
    assert "WARNED:" in out and "/bin/false failed to build" in out and "torch's GEMM libraries" in out, out
    assert "few_rows False True" in out, out


def test_the_switch_turns_the_kernel_off_quietly(tmp_path):
    out = run_without_kernel(tmp_path, SPECLAB_CPU_GEMM="0")
    assert "WARNED:" not in out and "few_rows False True" in out, out
