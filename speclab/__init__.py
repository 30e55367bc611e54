"""speclab: speculative decoding for LLMs, from the math to the kernel.

The library the lessons in notebooks/ build, one concept per module:
  sampling   logits -> probabilities (temperature, top-k, top-p), greedy and seeded sampling
  verify     the verification rules (RULES, keyed by vLLM's rejection_sample_method): accept
             min(1, p/q), residual max(p - q, 0), bonus token; and their torch / Triton implementations
  stats      chi-squared tests, TV distance, and the speedup theory
  metrics    vLLM's spec-decode counters
  toy        Markov-chain language models with exact distributions
  reference  the speculative loop for one sequence
  models     the embedded model pair, and speclab's own Llama forward over a paged KV cache
  kv_cache   block pool, block tables, slot mapping, rollback
  engine     request, scheduler, model runner, engine loop (vLLM v1 in miniature)
  proposers  the drafters (METHODS, keyed by vLLM's speculative `method`)
  llm        LLM and SamplingParams, vLLM's offline API

The names below load on first use (PEP 562), so `import speclab.verify` does not load the engine.

Glossary: one name per quantity, everywhere in the code (vLLM's names).
  num_speculative_tokens  k: the most drafts per request and step; owned by the speculative config
                          (SpeculativeConfig), from which EngineConfig and the proposer take it
  num_draft_tokens        the drafts a request actually verifies in one step (0 <= . <= k; fewer when
                          the proposer found none, the token budget truncated them, or max_tokens is near)
  num_accepted_tokens     the drafts the target kept in that step (0 <= . <= num_draft_tokens)
  num_drafts              the counter of (request, step) pairs that verified at least one draft
                          (vLLM's spec_decode_num_drafts); mean acceptance length = 1 + accepted / drafts
  num_lookahead_tokens    KV slots per decoding request reserved for a head that drafts after the
                          target forward (EAGLE / MTP write k of them into the target's block tables)
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "speclab.llm", "RequestOutput": "speclab.llm", "CompletionOutput": "speclab.llm",
    "SamplingParams": "speclab.sampling_params",
    "PLACEHOLDER_TOKEN_ID": "speclab.verify", "rejection_sample": "speclab.verify",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # once loaded, a plain attribute
        return value
    raise AttributeError(f"module 'speclab' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])
