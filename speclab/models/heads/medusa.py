"""Medusa: k parallel heads on the target's last hidden state, one token each (lesson 08).

Cai, Li, Geng, Peng, Lee, Chen, Dao, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads" (ICML 2024). Head i (1-based) reads the target's final hidden state h_t,
the one its LM head turns into x_{t+1}, and guesses x_{t+1+i}:

    q_i = softmax( lm_head( z + SiLU(W_i z + b_i) ) ),   z = norm(h_t)   (W_i zero-initialised)

so each head starts as "the LM head again" and learns a residual correction. The heads never see
the token sampled at t+1, nor each other's guesses: all k drafts come from one cheap pass with no
KV cache, which is why Medusa is the cheapest head to run and the first to lose acceptance with
depth (EAGLE's shifted token input is the fix). Here the heads share the target's LM head (Medusa
gives each head a copy initialised from it); a token tree over the heads' top-s waits for lesson 10.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from speclab.models.heads.config import HeadConfig


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W zero-initialised: the identity at the start of training."""

    def __init__(self, D: int):
        super().__init__()
        self.linear = nn.Linear(D, D)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x):
        return x + F.silu(self.linear(x))


class MedusaHead(nn.Module):
    """cfg.num_heads residual heads sharing the target's final norm and LM head."""

    def __init__(self, cfg: HeadConfig, target):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(ResBlock(cfg.target["hidden_size"]) for _ in range(cfg.num_heads))
        self._target = [target]

    @property
    def target(self):
        return self._target[0]

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """hidden (..., d): the target's last-layer output (before its final norm) at position t.
        Returns (num_heads, ..., V) float logits: row i-1 is head i's guess of x_{t+1+i}."""
        z = self.target.model.norm(hidden)
        blocks = self.blocks[:num_heads] if num_heads is not None else self.blocks
        dtype = self.blocks[0].linear.weight.dtype  # the blocks may run in another dtype (draft_dtype)
        return torch.stack([self.target.lm_head(b(z.to(dtype)).to(z.dtype)).float() for b in blocks])
