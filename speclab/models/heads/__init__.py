"""Draft heads on a target's hidden states: their config, directories, loading and the target check.

A head (EAGLE, EAGLE-3-style, MTP, Medusa; lesson 08) is not a language model of its own: it reads
the hidden states of one particular target and drafts through that target's frozen embedding, final
norm and LM head. So a head directory holds only the head's own weights, HF-style:

    config.json        method, the target it was made for, the layers it reads, its layer's dims
    model.safetensors  the head's parameters (float16)
    MANIFEST.json      how it was trained: data, steps, losses, minutes, acceptance, the command

and loading one checks that it was made for the target it is given (hidden size, vocab size, layer
count), with a message that names the mismatch. Names of the shipped heads resolve to
speclab/checkpoints/heads/NAME (`HEADS_DIR`). The config and the target check live in config.py,
which the head files import; this package's root loads and builds them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from speclab.models.heads.config import HEAD_METHODS, HeadConfig, check_target, target_signature
from speclab.models.heads.eagle import EagleHead
from speclab.models.heads.medusa import MedusaHead
from speclab.models.heads.mtp import MTPHead

HEADS_DIR = Path(__file__).resolve().parents[2] / "checkpoints" / "heads"
# method -> the shipped head for the embedded target, and for the real model
DEFAULT_HEADS = {"target": {m: m for m in HEAD_METHODS}, "smollm2": {"eagle": "eagle-smollm2"}}


def head_directory(name) -> Path:
    """A head directory: a path, or the name of a shipped head (speclab/checkpoints/heads/NAME)."""
    p = Path(name)
    if (p / "config.json").exists():
        return p
    if (HEADS_DIR / str(name) / "config.json").exists():
        return HEADS_DIR / str(name)
    shipped = sorted(d.name for d in HEADS_DIR.iterdir()) if HEADS_DIR.exists() else []
    raise FileNotFoundError(f"{name!r} is not a head directory (config.json + model.safetensors) nor a shipped "
                            f"head; shipped heads: {shipped}")


def head_method(name) -> str | None:
    """The method a head directory (or shipped name) was made for; None when `name` is no head."""
    try:
        path = head_directory(name)
    except (FileNotFoundError, OSError, TypeError):
        return None
    return json.loads((path / "config.json").read_text()).get("method")


def save_head(head, path, manifest: dict | None = None) -> Path:
    """Write config.json, model.safetensors (float16, the head's own weights only) and MANIFEST.json."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(head.cfg.to_json(), indent=1) + "\n")
    state = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(path / "model.safetensors"))
    if manifest is not None:
        (path / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def load_head(name, target, dtype=torch.float32, method: str | None = None):
    """The head in `name` (a directory or a shipped name) bound to `target`, checked against it
    (and against `method`, the speculative_config's, when given)."""
    from safetensors.torch import load_file

    path = head_directory(name)
    cfg = HeadConfig.from_json(json.loads((path / "config.json").read_text()))
    if cfg.method not in HEAD_METHODS:
        raise ValueError(f"{path}: method {cfg.method!r} is not a head method {HEAD_METHODS}")
    if method is not None and cfg.method != method:
        raise ValueError(f"head {path.name} is a {cfg.method} head, but speculative_config asks for method "
                         f"{method!r}: use method {cfg.method!r} or a {method} head")
    check_target(cfg, target, f"head {path.name}")
    head = build_head(cfg, target)
    missing, unexpected = head.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match a {cfg.method} head (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]})")
    return head.to(dtype=dtype, device=target.lm_head.weight.device).eval()


def build_head(cfg: HeadConfig, target):
    """A freshly initialised head of `cfg`'s family for `target`."""
    return {"medusa": MedusaHead, "mtp": MTPHead}.get(cfg.method, EagleHead)(cfg, target)


def new_config(method: str, target, name: str | None = None, hidden_layers=None, num_heads: int = 0,
               draft_vocab_size: int | None = None, intermediate_size: int | None = None) -> HeadConfig:
    """The config of a new head for `target`: EAGLE and MTP read the last layer, EAGLE-3-style fusion
    a low, a middle and the last layer; the decoder layer has the target's own layer dims, except its
    MLP's width where `intermediate_size` is given (more capacity, for more weights read at each
    drafting step)."""
    c = target.config
    L = c.num_hidden_layers
    if hidden_layers is None:
        hidden_layers = (2, L // 2, L) if method == "eagle3" else (L,)
    layer = {} if method == "medusa" else {
        "hidden_size": c.hidden_size, "intermediate_size": intermediate_size or c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta}
    return HeadConfig(method, target_signature(target, name), tuple(hidden_layers), layer, num_heads, draft_vocab_size)
