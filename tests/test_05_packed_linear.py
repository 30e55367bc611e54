"""The inference forward's fused and packed projections (speclab.models.packed_linear): the same
function as the plain weights, kept in step with them when they change or move."""

import pytest
import torch

from speclab.models.llama import LlamaForCausalLM, load_llama
from speclab.models.packed_linear import PackedLinear, packing_enabled
from tests.helpers import short_forward_logits as logits, tiny_llama


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 37])
def test_packed_linear_equals_f_linear(dtype, rows):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=g).to(dtype)
    x = torch.randn(rows, 40, generator=g).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2   # a different summation order, then bf16 rounding
    torch.testing.assert_close(PackedLinear(w)(x).float(), torch.nn.functional.linear(x, w).float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("library", [False, True], ids=["no library bf16 (AVX2)", "library bf16"])
def test_bfloat16_without_library_kernels_takes_the_few_row_kernel_at_any_row_count(monkeypatch, library):
    """Where oneDNN has no bfloat16 kernels, F.linear in bfloat16 was 5-6x slower than speclab's kernel at
    17-128 rows (a prompt's prefill): those products go to the kernel too, with its bits. Where it has
    them, more rows than a verify step's stay with the library."""
    from speclab.models import cpu_gemm, packed_linear
    if not cpu_gemm.available():
        pytest.skip(f"speclab's CPU kernel is not built here: {cpu_gemm.why_unavailable()}")
    monkeypatch.setattr(packed_linear, "library_bf16", lambda: library)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=g).to(torch.bfloat16)
    x = torch.randn(cpu_gemm.MAX_ROWS + 21, 40, generator=g).to(torch.bfloat16)
    calls, xwt = [], cpu_gemm.xwt
    monkeypatch.setattr(cpu_gemm, "xwt", lambda *a: calls.append(a[0].shape[0]) or xwt(*a))
    y = PackedLinear(w)(x)
    assert calls == ([x.shape[0]] if not library else [])
    if not library:
        assert torch.equal(y, xwt(x, w))
    torch.testing.assert_close(y.float(), torch.nn.functional.linear(x, w).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prefill_takes_onednn_on_the_plain_weight_without_a_copy(monkeypatch, dtype):
    """More rows than the few-row kernel takes, before any packed copy is made (a prompt's prefill):
    oneDNN's product on the plain weight (twice F.linear's speed on a Zen 5, the module docstring), the
    same function, and no second copy of the weight."""
    w = torch.randn(192, 64, generator=torch.Generator().manual_seed(7)).to(dtype)
    if not packing_enabled(w):
        pytest.skip(f"oneDNN has no {dtype} product here (packing_enabled)")
    lin, calls = PackedLinear(w), []
    plain = PackedLinear._plain_onednn
    monkeypatch.setattr(PackedLinear, "_plain_onednn", lambda self, x: calls.append(x.shape[0]) or plain(self, x))
    x = torch.randn(200, 64, generator=torch.Generator().manual_seed(8)).to(dtype)
    y = lin(x)
    assert calls == ([200] if lin.few_rows else []), "a prefill-sized product did not take oneDNN on the plain weight"
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.float(), torch.nn.functional.linear(x, w).float(), rtol=tol, atol=tol)
    if lin.few_rows:
        assert not lin.is_packed, "the prefill made a packed copy of the weight"
    view = torch.randn(192, 128, generator=torch.Generator().manual_seed(9)).to(dtype)[:, :64]  # rows 128 apart
    torch.testing.assert_close(PackedLinear(view)(x).float(), torch.nn.functional.linear(x, view).float(),
                               rtol=tol, atol=tol)


def test_a_weight_onednn_refuses_falls_back_to_f_linear(monkeypatch):
    """Where oneDNN raises for a weight (a build or layout it does not take), the product is F.linear's,
    and that weight stops asking oneDNN."""
    w = torch.randn(192, 64, generator=torch.Generator().manual_seed(10))
    lin = PackedLinear(w)
    if not (lin.packable and lin.few_rows):
        pytest.skip("no plain oneDNN path here (oneDNN or speclab's kernel missing)")

    def refuse(*_args):
        raise RuntimeError("unsupported")
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", refuse)
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(11))
    assert torch.equal(lin(x), torch.nn.functional.linear(x, w))
    assert not lin.packable


def test_packing_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("SPECLAB_PACKED_LINEAR", "0")
    w = torch.randn(8, 4)
    assert not packing_enabled(w) and not PackedLinear(w).is_packed


@pytest.fixture(scope="module")
def two_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    tiny_llama(root / "a", vocab_size=50, seed=0)
    tiny_llama(root / "b", vocab_size=50, seed=1)
    return root / "a", root / "b"


def test_weights_loaded_after_the_first_forward_are_used(two_dirs):
    """load_state_dict copies into the fused weights in place: the packed copies follow."""
    a, b = two_dirs
    model, other = load_llama(a), load_llama(b)
    before = logits(model)
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(logits(model), logits(other), rtol=0, atol=0)
    assert not torch.equal(before, logits(model))


def test_converting_a_prepared_model_prepares_it_again(two_dirs):
    a, _ = two_dirs
    model = load_llama(a)
    assert logits(model.to(torch.bfloat16)).dtype == torch.float32      # logits stay float32
    torch.testing.assert_close(logits(model), logits(load_llama(a, dtype=torch.bfloat16)), rtol=0, atol=0)


def test_a_model_built_in_code_prepares_itself(two_dirs):
    a, _ = two_dirs
    ref = load_llama(a)
    model = LlamaForCausalLM(ref.config).eval()
    model.load_state_dict(ref.state_dict())
    torch.testing.assert_close(logits(model), logits(ref), rtol=0, atol=0)
    model.load_state_dict(ref.state_dict())         # prepared inside inference_mode: still ordinary tensors
