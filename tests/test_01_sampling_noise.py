"""The sampler's Exp(1) noise is torch's `exponential_`, bit for bit, drawn three times faster.

`speclab.sampling.exponential_noise` computes -log1p(-u) over the float64 uniforms that a CPU
generator's `exponential_` draws, in one vectorised pass, and rounds to float32. It must give the same
numbers and leave the generator where `exponential_` leaves it: then a seeded request's tokens, the
engine's stream after a step, and every sampled output stay what they were before the change. The
negative control shows the check can fail: -log(u), the same law from the same uniforms, differs.
"""

import torch

from speclab.sampling import exponential_noise, keyed_noise, position_key
from speclab.verify.layout import draw_noise


def _same_as_exponential(shape, seed, noise=exponential_noise) -> bool:
    g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    a = torch.empty(shape).exponential_(generator=g1)
    b = noise(shape, g2)
    return a.dtype == b.dtype and torch.equal(a, b) and torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))


def test_the_same_bits_and_generator_state_as_exponential_():
    for seed in range(12):
        for shape in [(49152,), (3, 49152), (2, 8192), (5, 37), (1,)]:
            assert _same_as_exponential(shape, seed), (shape, seed)


def test_a_different_transform_of_the_same_uniforms_is_caught():
    """Negative control: -log(u) is Exp(1) too, from the same uniforms, and is not the same numbers."""
    other = lambda shape, g: torch.rand(shape, dtype=torch.float64, generator=g).log_().neg_().float()  # noqa: E731
    assert not _same_as_exponential((8192,), 0, other)


def test_keyed_and_engine_noise_are_unchanged():
    """keyed_noise's row for (seed, position) and draw_noise's (B, V) block are exponential_'s numbers."""
    V = 4096
    rows = keyed_noise(7, [0, 5, 9], V)
    for i, t in enumerate([0, 5, 9]):
        want = torch.empty(V).exponential_(generator=torch.Generator().manual_seed(position_key(7, t)))
        assert torch.equal(rows[i], want.clamp(min=torch.finfo(torch.float32).tiny))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    want = torch.empty(2, V).exponential_(generator=g1).clamp(min=torch.finfo(torch.float32).tiny)
    assert torch.equal(draw_noise(2, V, g2, "cpu"), want)
