"""Weights in a huge-page arena (speclab.models.huge_pages): the same values and layout, the model's
fused weights and its modules' weights living there, the same logits bit for bit, and off when
switched off. (Whether the kernel really backs the arena with 2 MB pages is the machine's choice:
its speed is measured in the closing notes, not asserted here.)"""

import pytest
import torch

from speclab.models import huge_pages
from speclab.models.llama import load_llama
from tests.helpers import short_forward_logits as logits, tiny_llama

needs_arena = pytest.mark.skipif(not huge_pages.enabled(), reason="huge-page arenas are used on Linux only")


@needs_arena
def test_allocate_is_aligned_to_a_huge_page():
    buf = huge_pages.allocate(3 << 20)
    assert buf.dtype == torch.uint8 and buf.numel() == 3 << 20 and buf.data_ptr() % huge_pages.HUGE == 0
    buf[-1] = 7  # writable to its last byte
    assert int(buf[-1]) == 7


def test_place_keeps_values_and_layout():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(5, 7, generator=g)
    cols = torch.randn(9, 6, generator=g).t().contiguous().t()  # (9, 6), stored (6, 9): fuse's layout without the kernel
    arena = huge_pages.Arena(4096)
    a, b = arena.place(rows), arena.place(cols.to(torch.bfloat16))
    assert torch.equal(a, rows) and a.stride() == rows.stride()
    assert torch.equal(b, cols.to(torch.bfloat16)) and b.stride() == cols.stride()
    assert (b.data_ptr() - a.data_ptr()) % huge_pages.ALIGN == 0  # each on its own cache line
    with pytest.raises(ValueError, match="arena_for"):
        arena.place(torch.zeros(2048))
    with pytest.raises(ValueError, match="contiguous"):
        arena.place(torch.zeros(4, 4)[:, ::2])


@needs_arena
def test_a_prepared_model_lives_in_one_arena_with_the_same_logits(tmp_path, monkeypatch):
    tiny_llama(tmp_path / "m", vocab_size=50, seed=0)
    monkeypatch.setenv("SPECLAB_HUGE_PAGES", "0")
    plain = load_llama(tmp_path / "m")
    monkeypatch.setenv("SPECLAB_HUGE_PAGES", "1")
    model = load_llama(tmp_path / "m")
    layer = model.model.layers[0]
    fused = [layer.self_attn.qkv.weight, layer.self_attn.o.weight, layer.mlp.gate_up.weight, model.head.weight]
    base = fused[0].untyped_storage().data_ptr()
    assert all(w.untyped_storage().data_ptr() == base for w in fused), "every fused weight in one arena"
    assert layer.self_attn.q_proj.weight.untyped_storage().data_ptr() == base  # the modules' weights are views of it
    assert plain.model.layers[0].self_attn.qkv.weight.untyped_storage().data_ptr() != \
        plain.model.layers[0].self_attn.o.weight.untyped_storage().data_ptr()  # control: apart without the arena
    assert torch.equal(logits(model), logits(plain))


def test_switched_off(monkeypatch):
    monkeypatch.setenv("SPECLAB_HUGE_PAGES", "0")
    assert not huge_pages.enabled() and huge_pages.arena_for([torch.zeros(4)]) is None
