"""Toy language models whose next-token distributions are known exactly.

A real model's output distribution over whole sequences cannot be enumerated, so the
statistical tests and lessons use Markov-chain "language models": the next token depends only
on the last one, through a (V, V) table. Their joint law over the next L tokens is a product of
table entries, so a speculative loop over them can be checked against exact probabilities.
"""

import itertools

import torch


class MarkovLM:
    """An order-1 Markov chain as a next-token-distribution callable.

    `lm(prefix)` returns the (V,) distribution of the token after `prefix`: row prefix[-1] of
    `transition`, or `initial` for an empty prefix.

    Args:
        transition: (V, V) float64, row t = distribution of the token after token t.
        initial: (V,) distribution of the first token; uniform when None.
    """

    def __init__(self, transition: torch.Tensor, initial: torch.Tensor | None = None):
        transition = torch.as_tensor(transition, dtype=torch.float64)
        V = transition.shape[0]
        if transition.shape != (V, V):
            raise ValueError(f"transition must be square (V, V), got {tuple(transition.shape)}")
        self.transition = transition / transition.sum(-1, keepdim=True)
        self.initial = torch.full((V,), 1.0 / V, dtype=torch.float64) if initial is None \
            else torch.as_tensor(initial, dtype=torch.float64) / torch.as_tensor(initial).sum()
        self.vocab_size = V

    def __call__(self, prefix) -> torch.Tensor:
        return self.transition[int(prefix[-1])] if len(prefix) else self.initial

    @classmethod
    def random(cls, vocab_size: int, generator: torch.Generator, spread: float = 2.0,
               zero_frac: float = 0.0) -> "MarkovLM":
        """A random chain with rows softmax(spread * N(0, 1)); `zero_frac` of entries forced to 0.

        A larger spread makes peaked rows (like a confident LM); zeros make supports differ
        (every row keeps at least its largest entry).
        """
        logits = spread * torch.randn(vocab_size + 1, vocab_size, generator=generator, dtype=torch.float64)
        if zero_frac > 0:
            zero = torch.rand(logits.shape, generator=generator, dtype=torch.float64) < zero_frac
            zero &= logits < logits.amax(-1, keepdim=True)
            logits = logits.masked_fill(zero, float("-inf"))
        rows = logits.softmax(-1)
        return cls(rows[1:], rows[0])

    def blend(self, other: "MarkovLM", weight: float) -> "MarkovLM":
        """(1 - weight) * self + weight * other, row by row: a draft close to (or far from) a target."""
        return MarkovLM((1 - weight) * self.transition + weight * other.transition,
                        (1 - weight) * self.initial + weight * other.initial)

    def joint(self, prefix, length: int) -> torch.Tensor:
        """Exact probabilities of every continuation of `length` tokens: a (V,) * length tensor."""
        V = self.vocab_size
        out = torch.empty((V,) * length, dtype=torch.float64)
        for seq in itertools.product(range(V), repeat=length):
            prob, ctx = 1.0, list(prefix)
            for t in seq:
                prob *= float(self(ctx)[t])
                ctx.append(t)
            out[seq] = prob
        return out
