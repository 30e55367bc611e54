"""Draft heads on a target's hidden states: their config, directories, loading and the target check.

A head (EAGLE, EAGLE-3-style, MTP, Medusa; lesson 08) is not a language model of its own: it reads
the hidden states of one particular target and drafts through that target's frozen embedding, final
norm and LM head. So a head directory holds only the head's own weights, HF-style:

    config.json        method, the target it was made for, the layers it reads, its layer's dims
    model.safetensors  the head's parameters (float16)
    MANIFEST.json      how it was trained: data, steps, losses, minutes, acceptance, the command

and loading one checks that it was made for the target it is given (hidden size, vocab size, layer
count), with a message that names the mismatch. Names of the shipped heads resolve to
speclab/checkpoints/heads/NAME (see `HEADS`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

HEADS_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "heads"
HEAD_METHODS = ("eagle", "eagle3", "mtp", "medusa")
# method -> the shipped head for the embedded target, and for the real model
DEFAULT_HEADS = {"target": {m: m for m in HEAD_METHODS}, "smollm2": {"eagle": "eagle-smollm2"}}


@dataclass
class HeadConfig:
    """Attributes:
        method: "eagle", "eagle3", "mtp" or "medusa".
        target: the target it was made for: hidden_size, vocab_size, num_hidden_layers (and a name).
        hidden_layers: target layers it reads (0 = embeddings, i = output of layer i, L = the last
            layer before the final norm), in the order it concatenates them.
        layer: dims of its decoder layer (LlamaConfig fields); empty for Medusa.
        num_heads: Medusa's parallel heads (the most drafts per step).
        draft_vocab_size: draft only over the most frequent tokens (EAGLE-3's d2t / FR-Spec); None: all.
    """

    method: str
    target: dict
    hidden_layers: tuple[int, ...]
    layer: dict = field(default_factory=dict)
    num_heads: int = 0
    draft_vocab_size: int | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["hidden_layers"] = list(self.hidden_layers)
        return {"architectures": [f"Speclab{self.method.capitalize()}Head"], "model_type": f"speclab_{self.method}", **d}

    @classmethod
    def from_json(cls, d: dict) -> "HeadConfig":
        keys = {f for f in cls.__dataclass_fields__}
        cfg = cls(**{k: v for k, v in d.items() if k in keys})
        cfg.hidden_layers = tuple(cfg.hidden_layers)
        return cfg


def target_signature(target, name: str | None = None) -> dict:
    """What a head must agree with: the target's hidden size, vocabulary and depth."""
    c = target.config
    sig = {"hidden_size": c.hidden_size, "vocab_size": c.vocab_size, "num_hidden_layers": c.num_hidden_layers}
    return {**sig, "name": name} if name else sig


def check_target(cfg: HeadConfig, target, where="the head") -> None:
    """ValueError unless the head was made for a target of this shape (the fix: the right head)."""
    have = target_signature(target)
    bad = [f"{k}={cfg.target.get(k)} (target has {v})" for k, v in have.items() if cfg.target.get(k) != v]
    if bad:
        made = cfg.target.get("name", "another model")
        raise ValueError(f"{where} ({cfg.method}) was made for {made}, not this target: {', '.join(bad)}; "
                         f"a head reads one target's hidden states: train one for this target "
                         f"(python -m speclab.train.heads) or pick the head made for it")
    if any(not 0 <= i <= have["num_hidden_layers"] for i in cfg.hidden_layers):
        raise ValueError(f"{where} reads layers {cfg.hidden_layers}, outside 0..{have['num_hidden_layers']}")


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
    if cfg.method == "medusa":
        from speclab.models.medusa import MedusaHead
        return MedusaHead(cfg, target)
    if cfg.method == "mtp":
        from speclab.models.mtp import MTPHead
        return MTPHead(cfg, target)
    from speclab.models.eagle import EagleHead
    return EagleHead(cfg, target)


def new_config(method: str, target, name: str | None = None, hidden_layers=None, num_heads: int = 0,
               draft_vocab_size: int | None = None) -> HeadConfig:
    """The config of a new head for `target`: EAGLE and MTP read the last layer, EAGLE-3-style fusion
    a low, a middle and the last layer; the decoder layer has the target's own layer dims."""
    c = target.config
    L = c.num_hidden_layers
    if hidden_layers is None:
        hidden_layers = (2, L // 2, L) if method == "eagle3" else (L,)
    layer = {} if method == "medusa" else {
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta}
    return HeadConfig(method, target_signature(target, name), tuple(hidden_layers), layer, num_heads, draft_vocab_size)
