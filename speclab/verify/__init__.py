"""Verification: which drafted tokens the target keeps, and which token it adds.

One rule per file, every rule on the same ragged batch (`layout.py`, vLLM's layout), registered in
`RULES` under vLLM's `rejection_sample_method` names:

    rejection.py   "standard": Leviathan et al. (2023), token by token (lessons 01 and 06)
    block.py       "block": Sun et al. (ICLR 2025), block verification (lesson 10)
    typical.py     "typical": Medusa-2's typical acceptance, LOSSY (lesson 10): only when asked for by name

`rejection_sample(..., method="standard")` is the entry point; `backend.get_rejection_sampler`
is the one place that picks an implementation of a rule (this torch reference, or the Triton
kernel of lesson 07, which must match it bit for bit). Adding a rule is one file and one line in
`RULES` (CONTRIBUTING.md walks through it).
"""

from speclab.verify import block, rejection, typical
from speclab.verify.layout import PLACEHOLDER_TOKEN_ID, draw_noise, draw_uniforms
from speclab.verify.rejection import verify_greedy_step, verify_step

# rejection_sample_method -> the torch reference of the rule (the signature of `rejection_sample`)
RULES = {
    "standard": rejection.rejection_sample,
    "block": block.rejection_sample,
    "typical": typical.rejection_sample,  # LOSSY: not distribution-preserving
}
LOSSY_RULES = ("typical",)  # never chosen by default or implemented by the kernels: by name only


def get_rule(method: str):
    """The torch reference of a rule, by its `rejection_sample_method` name; a clear error otherwise."""
    if method in RULES:
        return RULES[method]
    raise ValueError(f"unknown rejection_sample_method {method!r}: choose one of {sorted(RULES)}")


def rejection_sample(draft_token_ids, num_draft_tokens, target_probs, draft_probs=None, *, greedy=False,
                     uniforms=None, noise=None, generator=None, method: str = "standard"):
    """Verify a ragged batch of drafts with the rule named `method` (see `RULES`).

    Args: those of `speclab.verify.rejection.rejection_sample` (the layout: `speclab.verify.layout`),
        and `method`, a `rejection_sample_method` name ("standard" by default, as in vLLM).
    Returns:
        (B, max_k + 1) int64: accepted drafts, then the recovered or bonus token, then -1.
    """
    return get_rule(method)(draft_token_ids, num_draft_tokens, target_probs, draft_probs, greedy=greedy,
                            uniforms=uniforms, noise=noise, generator=generator)


__all__ = ["LOSSY_RULES", "PLACEHOLDER_TOKEN_ID", "RULES", "draw_noise", "draw_uniforms", "get_rule",
           "rejection_sample", "verify_greedy_step", "verify_step"]
