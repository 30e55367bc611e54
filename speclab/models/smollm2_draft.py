"""The real model's draft: a 4-layer SmolLM2 distilled here, shipped without its embedding table.

SmolLM2-135M-Instruct's embedding table (49152 x 576, tied to its LM head) is 113 MB in float32,
more than the whole draft may ship (40 MB). The draft shares it: it was trained with the target's
embeddings frozen (and tied), so only its own weights ship, in `speclab/checkpoints/smollm2-draft/`:

    config.json          the draft's Hugging Face LlamaConfig (4 layers, otherwise the target's)
    layers.safetensors   its decoder layers and final norm, float16 (about 28 MB)
    token_ranking.json   the vocabulary, most often written first, for `draft_vocab_size`
                         (speclab/models/draft_vocab.py; built by speclab/train/draft_vocab.py)
    MANIFEST.json        how it was trained and how well it drafts (see speclab/train/smollm2_draft.py)

`draft_dir()` materializes a complete Hugging Face Llama directory in the cache on first use:
the shipped layers in float32 plus the target's embedding table and tokenizer, taken from the
converted target (`speclab.models.smollm2.model_dir()`), built atomically under a lock. So
`AutoModelForCausalLM.from_pretrained(draft_dir())`, transformers' assisted generation
(`assistant_model=`) and speclab's `LLM(..., speculative_config={"method": "draft_model",
"model": "smollm2-draft"})` all load the same draft. Needs the real model's wheel, like the target.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from speclab.models.draft_vocab import RANKING_FILE  # copied into the draft's directory when shipped

DRAFT_VOCAB = 8192  # the draft_vocab_size the course runs this draft at (demo, bench heads, bench vs-vllm): on
                   # 2026-12-02 (AMD EPYC, two bench heads runs) it cut c from 0.23-0.30 to 0.13-0.17 at the same
                   # acceptance (held-out coverage 0.962 of the target's probability; the manifest's token_ranking)
NAMES = ("smollm2-draft",)            # what `hub.resolve` maps to draft_dir()
SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints" / "smollm2-draft"
WEIGHTS = "layers.safetensors"
CACHE_PREFIX = "smollm2-draft"
FORMAT = 2                            # bump when materialization changes (2: the token ranking)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def shipped_sha256() -> str:
    """sha256 of the shipped weights, config and token ranking (a new training run or ranking gives a new
    cache directory)."""
    h = hashlib.sha256()
    for name in ("config.json", WEIGHTS, RANKING_FILE):
        path = SHIPPED / name
        if name == RANKING_FILE and not path.is_file():
            continue  # optional: only draft_vocab_size needs it
        if not path.is_file():
            raise FileNotFoundError(f"the SmolLM2 draft is not shipped in this checkout ({path} is missing): "
                                    f"train it with `python -m speclab.train.smollm2_draft`")
        h.update(path.read_bytes())
    return h.hexdigest()


def shipped_manifest() -> dict:
    return json.loads((SHIPPED / "MANIFEST.json").read_text())


def draft_dir(*, verbose: bool = True) -> Path:
    """The complete HF directory of the draft, materialized in the cache on first use (a few seconds)."""
    from speclab.models.smollm2 import _build_atomically, cache_root, model_dir

    sha = shipped_sha256()
    dest = cache_root() / f"{CACHE_PREFIX}-{sha[:12]}"
    if _complete(dest, sha):
        return dest
    target = model_dir(verbose=verbose)          # FileNotFoundError naming the install when the wheel is absent
    return _build_atomically(dest, lambda tmp: materialize(SHIPPED, target, tmp, sha), verbose=verbose,
                             complete=lambda d: _complete(d, sha))


def _complete(dest: Path, sha: str) -> bool:
    try:
        m = json.loads((dest / "MANIFEST.json").read_text())
    except (OSError, ValueError):
        return False
    return m.get("format") == FORMAT and m.get("shipped_sha256") == sha


def materialize(shipped: Path, target: Path, out: Path, sha: str | None = None) -> None:
    """Write a complete HF Llama directory into `out`: shipped layers (float32) + the target's embeddings."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    layers = {k: v.to(torch.float32) for k, v in load_file(str(shipped / WEIGHTS)).items()}
    with safe_open(str(target / "model.safetensors"), framework="pt") as f:
        layers["model.embed_tokens.weight"] = f.get_tensor("model.embed_tokens.weight").to(torch.float32)
    save_file({k: v.contiguous() for k, v in layers.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((shipped / "config.json").read_text())
    tconfig = json.loads((target / "config.json").read_text())
    if config["vocab_size"] != tconfig["vocab_size"] or config["hidden_size"] != tconfig["hidden_size"]:
        raise ValueError(f"the shipped draft (vocab {config['vocab_size']}, width {config['hidden_size']}) does not "
                         f"fit the target at {target}: retrain it with `python -m speclab.train.smollm2_draft`")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("generation_config.json", *TOKENIZER_FILES):
        if (target / name).is_file():
            shutil.copy(target / name, out / name)
    if (shipped / RANKING_FILE).is_file():
        shutil.copy(shipped / RANKING_FILE, out / RANKING_FILE)
    manifest = {"format": FORMAT, "shipped_sha256": sha or shipped_sha256(),
                "about": "materialized by speclab.models.smollm2_draft: shipped layers + the target's embeddings",
                "shipped": str(shipped), "target": str(target)}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")


def shipped_bytes() -> int:
    """Bytes of every file shipped in speclab/checkpoints/smollm2-draft/ (the cap is 40 MB)."""
    return sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file())
