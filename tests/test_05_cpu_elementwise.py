"""The elementwise CPU kernels (speclab.models.cpu_elementwise): RMSNorm, RoPE with the cache write
and SwiGLU against torch's ops; RoPE bit for bit; a row's result the same bits alone and in any
batch; a slot outside the cache refused before anything is written; the model's forward the same
function with the kernels and without; and torch's ops wherever they do not apply."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from speclab.models import cpu_elementwise, llama
from speclab.models.llama import LlamaConfig, LlamaForCausalLM

needs_kernel = pytest.mark.skipif(not cpu_elementwise.available(),
                                  reason=f"kernels not built: {cpu_elementwise.why_unavailable()}")


@pytest.fixture(autouse=True)
def no_grad():
    with torch.inference_mode():
        yield


@needs_kernel
@pytest.mark.parametrize("d", [576, 64, 13])  # SmolLM2's width, a small one, one that is not a multiple of 8
def test_rms_norm_matches_torch(d):
    g = torch.Generator().manual_seed(d)
    x = torch.randn(9, d + 7, generator=g)[:, :d] * 5  # rows with a stride, as a view of a wider tensor
    w = torch.randn(d, generator=g)
    ours = cpu_elementwise.rms_norm(x, w, 1e-5)
    torch.testing.assert_close(ours, w * F.rms_norm(x, (d,), eps=1e-5), rtol=2e-6, atol=1e-6)
    x64 = x.double()
    exact = x64 / (x64.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w.double()
    torch.testing.assert_close(ours.double(), exact, rtol=1e-6, atol=1e-6)
    assert torch.equal(cpu_elementwise.rms_norm(x[4:5], w, 1e-5), ours[4:5])  # a row alone: the same bits


@needs_kernel
def test_silu_mul_matches_torch_over_the_whole_range():
    """Gates from -100 to 100 (exp's clamps at both ends), zeros, and ordinary values."""
    g = torch.Generator().manual_seed(0)
    gate = torch.cat([torch.linspace(-100, 100, 2001), torch.zeros(7), torch.randn(1000, generator=g) * 3])
    up = torch.randn(len(gate), generator=g)
    rows = torch.stack([torch.cat([gate, up]), torch.cat([gate.flip(0), up])])
    ours = cpu_elementwise.silu_mul(rows)
    expected = F.silu(rows[:, :len(gate)].double()) * rows[:, len(gate):].double()
    torch.testing.assert_close(ours.double(), expected, rtol=1e-6, atol=1e-30)
    assert torch.equal(cpu_elementwise.silu_mul(rows[1:]), ours[1:])


def rope_case(rows=5, H=9, Hkv=3, Dh=64, slots=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, (H + 2 * Hkv) * Dh, generator=g)
    positions = torch.randint(0, 500, (rows,), generator=g)
    cos, sin = llama.rope_tables(positions, Dh, 10000.0, torch.float32)
    slot_mapping = torch.randperm(slots, generator=g)[:rows]
    caches = torch.randn(slots // 8, 8, Hkv, Dh, generator=g), torch.randn(slots // 8, 8, Hkv, Dh, generator=g)
    return qkv, cos, sin, slot_mapping, caches


def torch_rope_cache(qkv, cos, sin, slot_mapping, k_cache, v_cache, H, Hkv):
    """What llama.Attention does without the kernel."""
    N, Dh = qkv.shape[0], k_cache.shape[-1]
    qk = llama.rotate(qkv[:, :(H + Hkv) * Dh].view(N, H + Hkv, Dh), cos, sin)
    k_cache.view(-1, Hkv * Dh).index_copy_(0, slot_mapping, qk[:, H:].reshape(N, Hkv * Dh))
    v_cache.view(-1, Hkv * Dh).index_copy_(0, slot_mapping, qkv[:, (H + Hkv) * Dh:])
    return qk[:, :H]


@needs_kernel
@pytest.mark.parametrize("H,Hkv,Dh", [(9, 3, 64), (4, 4, 8), (6, 1, 128)])
def test_rope_and_the_cache_write_are_torch_s_bit_for_bit(H, Hkv, Dh):
    qkv, cos, sin, slots, (kc, vc) = rope_case(H=H, Hkv=Hkv, Dh=Dh, seed=Dh)
    kc2, vc2 = kc.clone(), vc.clone()
    expected_q = torch_rope_cache(qkv.clone(), cos, sin, slots, kc2, vc2, H, Hkv)
    cpu_elementwise.rope_cache(qkv, cos, sin, slots, kc, vc, H, Hkv)
    assert torch.equal(qkv[:, :H * Dh].view(len(qkv), H, Dh), expected_q)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


@needs_kernel
def test_a_slot_outside_the_cache_is_refused_before_anything_is_written():
    qkv, cos, sin, slots, (kc, vc) = rope_case()
    before = qkv.clone(), kc.clone(), vc.clone()
    for bad in (-1, kc.shape[0] * kc.shape[1]):
        slots[-1] = bad
        with pytest.raises(IndexError, match="outside the KV cache"):
            cpu_elementwise.rope_cache(qkv, cos, sin, slots, kc, vc, 9, 3)
        assert all(torch.equal(a, b) for a, b in zip((qkv, kc, vc), before))


def tiny_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    return LlamaForCausalLM(cfg).eval()


@needs_kernel
def test_the_model_computes_the_same_function_with_and_without_the_kernels(monkeypatch):
    from speclab.engine.batch import flatten
    from speclab.kv_cache import KVCacheManager
    model = tiny_model()

    def logits():
        kv = KVCacheManager(8, 16)
        caches = model.allocate_kv_cache(8, 16)
        kv.allocate("a", 0, 40)
        ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
        model(*flatten(kv, [("a", ids[:35], 0)]), caches)
        return model.compute_logits(model(*flatten(kv, [("a", ids[35:], 35)]), caches)[0])

    calls = []
    real = cpu_elementwise.applies
    monkeypatch.setattr(cpu_elementwise, "applies", lambda *t: calls.append(1) or real(*t))
    ours = logits()
    assert calls, "the kernels were not used"
    monkeypatch.setattr(cpu_elementwise, "applies", lambda *t: False)
    torch.testing.assert_close(ours, logits(), rtol=1e-5, atol=1e-5)


def test_torch_s_ops_take_what_the_kernels_do_not():
    x = torch.randn(3, 64)
    assert not cpu_elementwise.applies(x.bfloat16())
    assert not cpu_elementwise.applies(x.t())  # columns, not rows, contiguous
    with torch.inference_mode(False), torch.enable_grad():
        w = torch.ones(64, requires_grad=True)
        assert not cpu_elementwise.applies(x, w)  # training keeps torch's ops (they have gradients)
        norm = llama.RMSNorm(64, 1e-5)
        norm(x).sum().backward()
        assert norm.weight.grad is not None


def test_the_switch_turns_the_kernels_off(tmp_path):
    script = ("import torch; from speclab.models import cpu_elementwise as c\n"
              "print('available', c.available(), c.why_unavailable())\n"
              "try:\n    c.silu_mul(torch.ones(1, 8))\nexcept RuntimeError as e:\n    print('refused:', e)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SPECLAB_CACHE": str(tmp_path), "SPECLAB_CPU_ELEMENTWISE": "0"}).stdout
    assert "available False SPECLAB_CPU_ELEMENTWISE=0" in out, out
    assert "refused: speclab's elementwise CPU kernels are not available: SPECLAB_CPU_ELEMENTWISE=0" in out, out


@needs_kernel
def test_a_kernel_called_first_loads_itself():
    """Called before `applies` or `available` ever ran in the process (a script or a lesson calling
    it directly), a kernel loads itself rather than failing on the unloaded table."""
    script = "import torch; from speclab.models import cpu_elementwise as c; print(c.silu_mul(torch.zeros(2, 6)).sum().item())"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "0.0", out.stderr
