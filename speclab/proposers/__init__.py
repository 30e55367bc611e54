"""The proposers, one per file, registered under vLLM's speculative `method` names.

    METHODS[method](speculative_config, context) -> a Proposer (speclab.engine.proposer)

`LLM` builds its proposer through this dict and nothing else; `context` (a ProposerContext) is what
the target side provides (the target model, its tokenizer, dtype, device and cache sizes). Adding a
proposer is one file with a `from_config`, one line here, and its keys in
`speclab.spec_config.SpeculativeConfig` (CONTRIBUTING.md walks through it).

`make_proposer(spec, context)` is what `LLM` calls: the method's proposer, or, with speclab's
`graft_method`, that drafter's tree with a lookup's chain grafted in (`speclab.proposers.graft`).
"""

from speclab.proposers import draft_model, eagle, graft, medusa, mtp, ngram, suffix


METHODS = {
    "ngram": ngram.from_config,              # lesson 03: prompt lookup
    "draft_model": draft_model.from_config,  # lesson 04: a smaller LM with the target's tokenizer
    "eagle": eagle.from_config,              # lesson 08: a head on the target's last hidden state
    "eagle3": eagle.from_config,             # lesson 08: a head on fused low / middle / top states
    "mtp": mtp.from_config,                  # lesson 08: DeepSeek-V3's MTP module, the EAGLE path
    "medusa": medusa.from_config,            # lesson 08: parallel heads, no recurrence
    "suffix": suffix.from_config,            # lesson 10: suffix trees over this request and earlier outputs
}

GRAFT_METHODS = ("ngram", "suffix")  # lookups whose chain `graft_method` adds to a model drafter's tree


def make_proposer(spec, context):
    """The proposer a SpeculativeConfig describes, built through METHODS."""
    if spec.graft_method is None:
        return METHODS[spec.method](spec, context)
    drafter, lookup = spec.grafted_parts()
    return graft.GraftedProposer(METHODS[drafter.method](drafter, context), METHODS[lookup.method](lookup, context))
