"""MTP: DeepSeek-V3's multi-token-prediction module, used as a drafter (lesson 08).

DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), section 2.2. Module k combines the previous
depth's hidden state and the embedding of the next token, each RMS-normalised, projects them
(M: 2d -> d), runs one transformer block and predicts through the shared output head:

    h'_t = M [ RMSNorm(h_t) ; RMSNorm(emb(x_{t+1})) ]      h^1 = Block(h')      P = OutHead(h^1)

The same causal chain as EAGLE (feature + shifted token), so vLLM drafts with MTP through its
EAGLE proposer, and so does speclab (`proposers/mtp.py`). In DeepSeek-V3 the module is trained
*jointly* with the model, as an auxiliary loss on the data's tokens (weight 0.1-0.3), and the model's
own features learn to serve it; here the target is frozen and the module is fitted after the fact,
on the same data loss, so it can only read what the target's features already hold. One module
drafts all k tokens by feeding its own output back (vLLM warns that reusing one layer lowers the
acceptance of later positions).
"""

from __future__ import annotations

import torch
from torch import nn

from speclab.models.heads.eagle import EagleHead
from speclab.models.heads.config import HeadConfig
from speclab.models.llama import RMSNorm


class MTPHead(EagleHead):
    """EAGLE's body with DeepSeek-V3's input: [RMSNorm(h); RMSNorm(emb)] -> M (the `fc`)."""

    def __init__(self, cfg: HeadConfig, target):
        super().__init__(cfg, target)
        D, eps = cfg.target["hidden_size"], cfg.layer["rms_norm_eps"]
        self.hnorm = RMSNorm(D, eps)
        self.enorm = RMSNorm(D, eps)

    def inputs(self, token_ids: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.hnorm(feature), self.enorm(self.embed(token_ids))], -1))
