"""MTP proposer: DeepSeek-V3's multi-token-prediction module drafting through the EAGLE path.

vLLM runs `method="mtp"` through its EAGLE proposer: the module's input is the same pair (the
target's hidden state at t, the token at t+1), it writes its KV into the target's block tables
through lookahead slots, and it drafts a chain by feeding its own output back (one module reused
for all k positions). Only the head differs (speclab/models/heads/mtp.py), so this is EagleProposer.
"""

from speclab.engine.proposer import ProposerContext
from speclab.proposers.eagle import EagleProposer, load_head_for


class MTPProposer(EagleProposer):
    """EagleProposer driving an MTPHead (see speclab.models.heads.mtp)."""


def from_config(spec, context: ProposerContext) -> MTPProposer:
    """`method: "mtp"` (the registry's constructor)."""
    return MTPProposer(load_head_for(spec, context), spec.num_speculative_tokens,
                       sample_method=spec.draft_sample_method)
