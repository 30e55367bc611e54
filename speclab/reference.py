"""The speculative loop for one sequence, written to be read (lesson 02).

Leviathan, Kalman & Matias (ICML 2023), Algorithm 1, repeated until enough tokens exist:
  1. draft: gamma tokens x_1..x_gamma, each from the draft's q given the tokens before it;
  2. score: one target call gives p_1..p_{gamma+1} at all gamma + 1 positions at once;
  3. verify: keep the accepted drafts, add one recovered or bonus token (speclab.verify);
  4. commit the new tokens and repeat.

Models here are "next-token distribution" callables: `model(tokens) -> (V,)` probabilities.
Any pair works: the toy Markov chains of `speclab.toy`, or a wrapper around a real model.
A real target scores all gamma + 1 positions in one forward; `score` spells out what that
forward computes.
"""

from typing import Callable, Sequence

import torch

from speclab.metrics import SpecDecodingStats
from speclab.sampling import greedy as argmax
from speclab.sampling import sample
from speclab.verify import verify_greedy_step, verify_step

NextTokenFn = Callable[[Sequence[int]], torch.Tensor]


def autoregressive_generate(target: NextTokenFn, prefix: Sequence[int], max_new_tokens: int, *,
                            greedy: bool = False, generator: torch.Generator | None = None) -> list[int]:
    """Plain decoding: one target call per token. Returns the new tokens only."""
    tokens = list(prefix)
    for _ in range(max_new_tokens):
        p = target(tokens)  # (V,)
        tokens.append(int(argmax(p)) if greedy else int(sample(p, generator)))
    return tokens[len(prefix):]


def draft_tokens(draft: NextTokenFn, tokens: Sequence[int], gamma: int, *, greedy: bool = False,
                 generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor]:
    """Run the draft gamma times. Returns the drafts and q: (gamma, V), the rows they came from."""
    ctx, drafts, q = list(tokens), [], []
    for _ in range(gamma):
        q_i = draft(ctx)  # (V,)
        x = int(argmax(q_i)) if greedy else int(sample(q_i, generator))
        drafts.append(x)
        q.append(q_i)
        ctx.append(x)
    return drafts, torch.stack(q) if q else torch.empty(0, 0)


def score(target: NextTokenFn, tokens: Sequence[int], drafts: Sequence[int]) -> torch.Tensor:
    """What one target forward over `tokens + drafts` yields: p, (gamma + 1, V).

    Row i is the target's distribution after tokens + drafts[:i]; the last row is the bonus.
    """
    ctx = list(tokens)
    return torch.stack([target(ctx + list(drafts[:i])) for i in range(len(drafts) + 1)])


def speculative_step(target: NextTokenFn, draft: NextTokenFn, tokens: Sequence[int], gamma: int, *,
                     greedy: bool = False, generator: torch.Generator | None = None,
                     verify=verify_step) -> list[int]:
    """One draft-score-verify round. Returns the 1..gamma+1 tokens to append.

    Args:
        verify: a verifier with `verify_step`'s signature (tests swap in broken ones).
    """
    drafts, q = draft_tokens(draft, tokens, gamma, greedy=greedy, generator=generator)
    p = score(target, tokens, drafts)  # (gamma + 1, V): the single target call
    if greedy:
        return verify_greedy_step(drafts, p)
    return verify(drafts, p, q if gamma else None, generator=generator)


def speculative_generate(target: NextTokenFn, draft: NextTokenFn, prefix: Sequence[int],
                         max_new_tokens: int, gamma: int, *, greedy: bool = False,
                         generator: torch.Generator | None = None, verify=verify_step,
                         stats: SpecDecodingStats | None = None) -> list[int]:
    """Generate `max_new_tokens` tokens speculatively. Returns the new tokens only.

    Near the end gamma shrinks so that no step overshoots (gamma drafts + 1 token <= remaining).

    Args:
        target, draft: next-token distribution callables over the same vocabulary.
        gamma: drafts per step (0 is plain decoding).
        stats: counters updated with every step's drafted and accepted counts.
    """
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    tokens = list(prefix)
    while len(tokens) - len(prefix) < max_new_tokens:
        k = min(gamma, max_new_tokens - (len(tokens) - len(prefix)) - 1)
        new = speculative_step(target, draft, tokens, k, greedy=greedy, generator=generator, verify=verify)
        if stats is not None:
            stats.observe(k, len(new) - 1)
        tokens.extend(new)
    return tokens[len(prefix):]
