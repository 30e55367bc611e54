"""A head's config and the target check: what every head file needs, and nothing that loads heads.

A head (EAGLE, EAGLE-3-style, MTP, Medusa; lesson 08) reads the hidden states of one particular
target, so its config names that target's shape, and loading one checks it (`check_target`). The head
files (eagle.py, medusa.py, mtp.py) import this module; the package's __init__ imports them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

HEAD_METHODS = ("eagle", "eagle3", "mtp", "medusa")


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
