"""What a long training run needs to stop and go on: a stop signal it can answer, and atomic checkpoints.

Both trainers that run for an hour or more on this CPU use it (`speclab.train.heads`, the SmolLM2
draft's `speclab.train.smollm2_draft`): Ctrl-C or SIGTERM asks the loop to stop; the loop writes one
more checkpoint and returns, and the same command with --resume goes on from it.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import torch


class Stop:
    """Ctrl-C or SIGTERM sets .asked; the loop then checkpoints and ends (a second Ctrl-C kills)."""

    def __init__(self):
        self.asked = False

    def __enter__(self):  # signal handlers exist only in the main thread: elsewhere, no early stop
        main = threading.current_thread() is threading.main_thread()
        self.old = {sig: signal.signal(sig, self._ask) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
        return self

    def _ask(self, sig, frame):
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


def save_atomic(path: Path, state: dict) -> None:
    """torch.save `state` to `path` through a temporary file: a stop in the middle leaves the previous one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
