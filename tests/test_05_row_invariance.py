"""A token's logits have the same bits in a one-token decode step and inside a five-token verify step,
in float32 and in bfloat16, on a CPU with speclab's kernels (one thread).

Every kernel on the forward's path computes a row in one order whatever the number of rows (the
few-row product on each of its bfloat16 paths, attention read in place, the elementwise passes), so
verification sees exactly the logits plain decoding would: greedy speculation cannot change a token
through rounding, in bfloat16 too. (A GEMM library picks its blocking per shape: its rows can move by
a rounding between a 1-row and a 5-row product, which in bfloat16 is a step of 2^-8 and can flip a
near-tie; lesson 06's caveat.) The model's widths are multiples of 32 so its products take the AMX
tiles where the CPU has them. Negative control: the same check with a product whose summation order
depends on the number of rows must fail.
"""

import pytest
import torch

from speclab.engine.batch import flatten
from speclab.kv_cache import KVCacheManager
from speclab.models import cpu_attention, cpu_elementwise, cpu_gemm
from speclab.models.llama import load_llama
from tests.helpers import needs_smollm2_wheel, tiny_llama

pytestmark = [pytest.mark.skipif(
    not (cpu_gemm.available() and cpu_attention.available() and cpu_elementwise.available()),
    reason="speclab's CPU kernels are not built here: " + (cpu_gemm.why_unavailable() or cpu_attention.why_unavailable()
                                                           or cpu_elementwise.why_unavailable())),
    pytest.mark.usefixtures("one_torch_thread")]  # tests/conftest.py

CONTEXT, NEW = 37, 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("invariant")
    tiny_llama(path, vocab_size=320, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, head_scale=4.0, seed=3)
    return path


def decode_and_verify(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of NEW tokens after CONTEXT cached ones: (NEW, V) from NEW one-token decode steps,
    and (NEW, V) from one NEW-token verify step over the same cache."""
    ids = torch.randint(0, model.config.vocab_size, (CONTEXT + NEW,), generator=torch.Generator().manual_seed(0)).tolist()
    kv = KVCacheManager(8, 16)
    caches = model.allocate_kv_cache(8, 16)
    kv.allocate("r", 0, CONTEXT + NEW)
    model(*flatten(kv, [("r", ids[:CONTEXT], 0)]), caches)
    step = [model.compute_logits(model(*flatten(kv, [("r", [ids[t]], t)]), caches)[0])[0]
            for t in range(CONTEXT, CONTEXT + NEW)]
    verify = model.compute_logits(model(*flatten(kv, [("r", ids[CONTEXT:], CONTEXT)]), caches)[0])
    return torch.stack(step), verify


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_token_s_logits_are_the_same_bits_decoded_and_verified(model_dir, dtype):
    model = load_llama(model_dir, dtype=dtype)
    step, verify = decode_and_verify(model)
    assert torch.equal(step, verify), f"{int((step != verify).sum())} logits differ between decode and verify ({dtype})"
    assert model.model.layers[0].mlp.gate_up.few_rows  # the kernel's path was the one taken


@pytest.mark.real_model
@needs_smollm2_wheel()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_smollm2_s_logits_are_the_same_bits_decoded_and_verified(dtype):
    """The real model: 30 layers, its tied 49,152-token head. Without speclab's kernels its float32
    logits differed in 234,573 of 245,760 places (up to 7e-5) on 2026-12-04's Xeon."""
    from speclab.models import smollm2
    step, verify = decode_and_verify(load_llama(smollm2.model_dir(), dtype=dtype))
    assert torch.equal(step, verify), f"{int((step != verify).sum())} logits differ between decode and verify ({dtype})"


def test_the_check_catches_a_product_whose_order_depends_on_the_rows(model_dir, monkeypatch):
    """Negative control: several rows summed as two halves of k (one row in one pass): the check must fail."""
    real = cpu_gemm.xwt

    def halves(x, w, path="best"):
        if x.shape[0] == 1:
            return real(x, w, path)
        h = x.shape[1] // 2
        return (real(x[:, :h], w[:, :h].contiguous(), path).float()
                + real(x[:, h:], w[:, h:].contiguous(), path).float()).to(x.dtype)
    monkeypatch.setattr(cpu_gemm, "xwt", halves)
    monkeypatch.setenv("SPECLAB_CPU_DECODER", "0")  # the layers module by module, so that they call the patched xwt
    model = load_llama(model_dir, dtype=torch.bfloat16)
    step, verify = decode_and_verify(model)
    assert not torch.equal(step, verify)
