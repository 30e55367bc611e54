"""speclab: speculative decoding for LLMs, from the math to the kernel.

The library the lessons in notebooks/ build, one concept per module:
  sampling   logits -> probabilities (temperature, top-k, top-p), greedy and seeded sampling
  verify     the verifier: accept min(1, p/q), residual max(p - q, 0), bonus token
  stats      chi-squared tests, TV distance, and the speedup theory
  metrics    vLLM's spec-decode counters
  toy        Markov-chain language models with exact distributions
  reference  the speculative loop for one sequence
"""

from speclab.verify import PLACEHOLDER_TOKEN_ID, rejection_sample

__version__ = "0.1.0"
__all__ = ["PLACEHOLDER_TOKEN_ID", "rejection_sample", "__version__"]
