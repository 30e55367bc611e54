"""A head's training run stops and resumes without changing what it trains (speclab.train.heads).

A run stopped by a signal half way and resumed with --resume ends with the same weights as the
same run left alone: the checkpoint holds the head, the optimiser, the step and the data generator.
Negative control: resuming without the data generator's state (a fresh generator) gives other weights.
The hidden states are collected in shards that a second collection reads back instead of recomputing.
"""

import signal

import pytest
import torch

from speclab.train import heads as H

ARGS = ["--method", "eagle", "--windows", "12", "--heldout-windows", "2", "--seq-len", "32", "--batch-size", "2",
        "--steps", "6", "--minutes", "1000", "--warmup", "2", "--threads", "1"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _weights(out):
    from safetensors.torch import load_file
    return load_file(str(out / "model.safetensors"))


def _stop_after(monkeypatch, n):
    """Raise SIGINT in this process while the n-th batch is drawn (the loop then checkpoints and ends)."""
    real, calls = H.batch, [0]

    def batch(*a, **k):
        calls[0] += 1
        if calls[0] == n:
            signal.raise_signal(signal.SIGINT)
        return real(*a, **k)
    monkeypatch.setattr(H, "batch", batch)


def test_a_stopped_run_resumes_to_the_same_weights(cache, monkeypatch):
    whole = H.main(ARGS + ["--out", str(cache / "whole")])
    assert whole["steps"] == 6 and whole["resumed"] == 0
    assert whole["load_average_during_training"]["samples"] >= 1
    _stop_after(monkeypatch, 3)
    assert H.main(ARGS + ["--out", str(cache / "split")]) is None, "a stopped run must not write its head"
    assert not (cache / "split").exists()
    ckpt = H.run_dir(cache / "split") / "checkpoint.pt"
    assert torch.load(ckpt, weights_only=False)["step"] == 3
    monkeypatch.undo()
    monkeypatch.setenv("SPECLAB_CACHE", str(cache / "cache"))
    split = H.main(ARGS + ["--out", str(cache / "split"), "--resume"])
    assert split["steps"] == 6 and split["resumed"] == 1
    a, b = _weights(cache / "whole"), _weights(cache / "split")
    assert all(torch.equal(a[k], b[k]) for k in a), "a resumed run must train exactly what the whole run trains"


def test_negative_control_resuming_without_the_generator_state_differs(cache, monkeypatch):
    H.main(ARGS + ["--out", str(cache / "whole")])
    _stop_after(monkeypatch, 3)
    H.main(ARGS + ["--out", str(cache / "broken")])
    monkeypatch.undo()
    monkeypatch.setenv("SPECLAB_CACHE", str(cache / "cache"))
    ckpt = H.run_dir(cache / "broken") / "checkpoint.pt"
    st = torch.load(ckpt, weights_only=False)
    st["gen"] = torch.Generator().manual_seed(123).get_state()
    torch.save(st, ckpt)
    H.main(ARGS + ["--out", str(cache / "broken"), "--resume"])
    a, b = _weights(cache / "whole"), _weights(cache / "broken")
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_hidden_states_are_collected_in_shards_that_a_second_collection_reuses(cache, monkeypatch):
    from speclab.models.hub import checkpoint_dir
    from speclab.models.llama import load_llama
    model = load_llama(checkpoint_dir("target"))
    seqs = [list(range(5, 45)), list(range(7, 30)), list(range(9, 60))]
    parts = cache / "parts"
    first = H.sharded_hidden_states(model, seqs, (8,), parts, shard_tokens=50)
    assert len(list(parts.glob("shard-*.pt"))) == 2 and [len(h) for h in first] == [40, 23, 51]
    monkeypatch.setattr(H, "hidden_states", lambda *a, **k: pytest.fail("a saved shard was recomputed"))
    again = H.sharded_hidden_states(model, seqs, (8,), parts, shard_tokens=50)
    assert all(torch.equal(x, y) for x, y in zip(first, again))
