"""speclab: speculative decoding for LLMs, from the math to the kernel.

The library the lessons in notebooks/ build, one concept per module:
  sampling   logits -> probabilities (temperature, top-k, top-p), greedy and seeded sampling
  verify     the verifier: accept min(1, p/q), residual max(p - q, 0), bonus token
  stats      chi-squared tests, TV distance, and the speedup theory
  metrics    vLLM's spec-decode counters
  toy        Markov-chain language models with exact distributions
  reference  the speculative loop for one sequence
  models     the embedded model pair, and speclab's own Llama forward over a paged KV cache
  kv_cache   block pool, block tables, slot mapping, rollback
  engine     request, scheduler, model runner, engine loop (vLLM v1 in miniature)
  llm        LLM and SamplingParams, vLLM's offline API
"""

from speclab.llm import LLM, CompletionOutput, RequestOutput
from speclab.sampling_params import SamplingParams
from speclab.verify import PLACEHOLDER_TOKEN_ID, rejection_sample

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "PLACEHOLDER_TOKEN_ID",
           "rejection_sample", "__version__"]
