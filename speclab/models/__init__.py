"""Models: loading the embedded target/draft pair (or any Hugging Face causal LM).

The loaders live in hub.py and return `transformers` models; speclab's own paged-KV Llama
forward will sit beside them in this package.
"""

from speclab.models.hub import (CHECKPOINTS, Pair, check_pair, checkpoint_dir, load_manifest, load_model,
                                load_pair, load_tokenizer, tokenizer_sha256)

__all__ = ["CHECKPOINTS", "Pair", "check_pair", "checkpoint_dir", "load_manifest", "load_model", "load_pair",
           "load_tokenizer", "tokenizer_sha256"]
