"""The elementwise CPU kernels (speclab.models.cpu_elementwise): RMSNorm, RoPE with the cache write
and SwiGLU against torch's ops, in float32 and bfloat16; RoPE bit for bit in both; a row's result the
same bits alone and in any batch; a slot outside the cache refused before anything is written; the model's forward the same
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


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bfloat16 steps apart two bfloat16 tensors' values are (same sign: their bits' distance)."""
    ai, bi = a.view(torch.int16).int(), b.view(torch.int16).int()
    return torch.where((ai < 0) == (bi < 0), (ai - bi).abs(), ai.abs() + bi.abs())


@needs_kernel
@pytest.mark.parametrize("d", [576, 64, 13])
def test_bfloat16_rms_norm_rounds_where_torch_does(d):
    """torch's bfloat16 RMSNorm (llama.RMSNorm: normalised in float32, rounded, times the weight,
    rounded): the kernel's float32 sum differs from torch's in its last bits, so an element can land
    one bfloat16 step away after rounding, rarely; never more."""
    g = torch.Generator().manual_seed(d)
    x = (torch.randn(64, d + 7, generator=g)[:, :d] * 5).bfloat16()
    w = torch.randn(d, generator=g).bfloat16()
    ours = cpu_elementwise.rms_norm(x, w, 1e-5)
    theirs = w * F.rms_norm(x.float(), (d,), eps=1e-5).to(torch.bfloat16)
    assert ours.dtype == torch.bfloat16
    ulps = bf16_ulps(ours, theirs)
    assert ulps.max() <= 1 and (ulps == 0).float().mean() >= 0.99, f"{(ulps > 0).sum()} of {ulps.numel()} differ"
    assert torch.equal(cpu_elementwise.rms_norm(x[4:5], w, 1e-5), ours[4:5])  # a row alone: the same bits


@needs_kernel
def test_bfloat16_silu_mul_rounds_where_torch_does():
    """torch's bfloat16 SwiGLU, F.silu(gate) * up: silu rounded, then the product rounded. The kernel's
    exp is within 2 float32 ulp of torch's, so silu(gate) can round one bfloat16 step away, rarely.
    Below gate = -88 the kernel's exp is clamped: silu is then about -1e-36 where torch's is -0.0
    (the float32 test above allows the same 1e-30)."""
    g = torch.Generator().manual_seed(1)
    gate = torch.cat([torch.linspace(-100, 100, 2001), torch.zeros(7), torch.randn(4000, generator=g) * 3])
    up = torch.randn(len(gate), generator=g)
    rows = torch.stack([torch.cat([gate, up]), torch.cat([gate.flip(0), up])]).bfloat16()
    ours = cpu_elementwise.silu_mul(rows)
    theirs = F.silu(rows[:, :len(gate)]) * rows[:, len(gate):]
    ulps = torch.where((ours.float() - theirs.float()).abs() <= 1e-30, 0, bf16_ulps(ours, theirs))
    assert ulps.max() <= 1 and (ulps == 0).float().mean() >= 0.99, f"{(ulps > 0).sum()} of {ulps.numel()} differ"
    assert torch.equal(cpu_elementwise.silu_mul(rows[1:]), ours[1:])


def test_the_ulp_distance_sees_one_step():
    """Negative control for the two tests above: one bfloat16 step up or down is 1, across zero 2."""
    x = torch.tensor([1.0, -1.0, 0.0], dtype=torch.bfloat16)
    up = torch.tensor([1.0078125, -0.99609375, -0.0], dtype=torch.bfloat16)
    assert bf16_ulps(x, up).tolist() == [1, 1, 32768] and bf16_ulps(x, x).tolist() == [0, 0, 0]


def rope_case(rows=5, H=9, Hkv=3, Dh=64, slots=40, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, (H + 2 * Hkv) * Dh, generator=g).to(dtype)
    positions = torch.randint(0, 500, (rows,), generator=g)
    cos, sin = llama.rope_tables(positions, Dh, 10000.0, dtype)
    slot_mapping = torch.randperm(slots, generator=g)[:rows]
    caches = (torch.randn(slots // 8, 8, Hkv, Dh, generator=g).to(dtype),
              torch.randn(slots // 8, 8, Hkv, Dh, generator=g).to(dtype))
    return qkv, cos, sin, slot_mapping, caches


def test_rope_tables_are_the_angles_cos_and_sin_at_any_position():
    """The table behind rope_tables grows past its first 4096 positions and gives each position the row
    the formula gives (HF Llama's: inv_freq = theta^(-2i/Dh), the halves repeated)."""
    Dh, theta = 64, 12345.0
    positions = torch.tensor([0, 7, 4095, 4096, 9000, 7])
    inv = 1.0 / theta ** (torch.arange(0, Dh // 2, dtype=torch.float32) / (Dh // 2))
    angles = positions.float()[:, None] * inv[None, :]
    for dtype in (torch.float32, torch.bfloat16):
        cos, sin = llama.rope_tables(positions, Dh, theta, dtype)
        assert cos.shape == sin.shape == (6, 1, Dh) and cos.dtype == dtype
        torch.testing.assert_close(cos[:, 0], torch.cat([angles.cos()] * 2, -1).to(dtype), rtol=0, atol=2e-6)
        torch.testing.assert_close(sin[:, 0], torch.cat([angles.sin()] * 2, -1).to(dtype), rtol=0, atol=2e-6)
        assert torch.equal(cos[1], cos[5])
    assert llama.rope_tables(torch.tensor([], dtype=torch.long), Dh, theta, torch.float32)[0].shape == (0, 1, Dh)


def torch_rope_cache(qkv, cos, sin, slot_mapping, k_cache, v_cache, H, Hkv):
    """What llama.Attention does without the kernel."""
    N, Dh = qkv.shape[0], k_cache.shape[-1]
    qk = llama.rotate(qkv[:, :(H + Hkv) * Dh].view(N, H + Hkv, Dh), cos, sin)
    k_cache.view(-1, Hkv * Dh).index_copy_(0, slot_mapping, qk[:, H:].reshape(N, Hkv * Dh))
    v_cache.view(-1, Hkv * Dh).index_copy_(0, slot_mapping, qkv[:, (H + Hkv) * Dh:])
    return qk[:, :H]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,Dh", [(9, 3, 64), (4, 4, 8), (6, 1, 128)])
def test_rope_and_the_cache_write_are_torch_s_bit_for_bit(H, Hkv, Dh, dtype):
    qkv, cos, sin, slots, (kc, vc) = rope_case(H=H, Hkv=Hkv, Dh=Dh, seed=Dh, dtype=dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    expected_q = torch_rope_cache(qkv.clone(), cos, sin, slots, kc2, vc2, H, Hkv)
    cpu_elementwise.rope_cache(qkv, cos, sin, slots, kc, vc, H, Hkv)
    assert torch.equal(qkv[:, :H * Dh].view(len(qkv), H, Dh), expected_q)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


@needs_kernel
def test_tables_of_another_dtype_are_refused_not_misread():
    qkv, cos, sin, slots, (kc, vc) = rope_case(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one dtype"):
        cpu_elementwise.rope_cache(qkv, cos.float(), sin.float(), slots, kc, vc, 9, 3)
    with pytest.raises(ValueError, match="one dtype"):
        cpu_elementwise.rms_norm(qkv, torch.ones(qkv.shape[1]), 1e-5)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        cpu_elementwise.silu_mul(qkv.half())


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
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_model_computes_the_same_function_with_and_without_the_kernels(monkeypatch, dtype):
    from speclab.engine.batch import flatten
    from speclab.kv_cache import KVCacheManager
    monkeypatch.setenv("SPECLAB_CPU_DECODER", "0")  # the layers module by module, through `applies`
    model = tiny_model().to(dtype)

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
    tol = 1e-5 if dtype == torch.float32 else 3e-2  # bfloat16: an activation a step away, 2 layers on
    torch.testing.assert_close(ours, logits(), rtol=tol, atol=tol)


def test_torch_s_ops_take_what_the_kernels_do_not():
    x = torch.randn(3, 64)
    assert cpu_elementwise.applies(x.bfloat16()) and not cpu_elementwise.applies(x.half())
    assert not cpu_elementwise.applies(x.bfloat16(), torch.ones(64))  # two dtypes
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
