"""Byte-level BPE tokenizer for the embedded pair, trained with the `tokenizers` library.

Byte-level BPE (GPT-2, Radford et al. 2019) maps every byte to a symbol first, so any text, source
code included, encodes and decodes back exactly: no unknown token, no normalisation, no cleanup of
spaces. One special token, `<|endoftext|>`, is the BOS, EOS and padding token; training documents
are joined with it. The tokenizer is saved as `tokenizer.json` + `tokenizer_config.json`, which
`transformers.AutoTokenizer.from_pretrained(dir)` opens as a `PreTrainedTokenizerFast`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE of `vocab_size` tokens (special token included) on `texts`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: str | Path, model_max_length: int = 512):
    """Save `tok` as a transformers fast tokenizer (tokenizer.json, tokenizer_config.json, ...)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS,
        clean_up_tokenization_spaces=False, model_max_length=model_max_length,
    )
    hf.save_pretrained(str(out_dir))
    return hf
