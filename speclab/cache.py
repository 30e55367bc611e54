"""Where speclab keeps what it builds on this machine: converted models, teacher data, hidden
states, training checkpoints and the compiled CPU kernel. Nothing here is downloaded."""

import os
from pathlib import Path


def cache_root() -> Path:
    """speclab's cache: $SPECLAB_CACHE, else $XDG_CACHE_HOME/speclab, else ~/.cache/speclab."""
    if os.environ.get("SPECLAB_CACHE"):
        return Path(os.environ["SPECLAB_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "speclab"
