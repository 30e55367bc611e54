"""A head's training run stops and resumes without changing what it trains (speclab.train.heads).

A run stopped by a signal half way and resumed with --resume ends with the same weights as the
same run left alone: the checkpoint holds the head, the optimiser, the step and the data generator.
Negative control: resuming without the data generator's state (a fresh generator) gives other weights.
The hidden states are collected in shards that a second collection reads back instead of recomputing,
and that two processes share through claim files (--collect-only on the other core): a shard a live
process holds is left to it and waited for, one whose process died is taken over.
"""

import signal
import subprocess
import sys
import threading

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


def _model_and_seqs():
    from speclab.models.hub import checkpoint_dir
    from speclab.models.llama import load_llama
    return load_llama(checkpoint_dir("target")), [list(range(5, 45)), list(range(7, 30)), list(range(9, 60))]


def test_a_shard_another_live_process_holds_is_left_to_it_and_waited_for(cache):
    model, seqs = _model_and_seqs()
    reference = H.sharded_hidden_states(model, seqs, (8,), cache / "ref", shard_tokens=50)
    parts = cache / "parts"
    parts.mkdir()
    held = parts / "shard-0001-of-0002.pt"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    held.with_suffix(".claim").write_text(str(holder.pid))
    # --collect-only: computes the free shard, leaves the held one, returns at once
    assert H.sharded_hidden_states(model, seqs, (8,), parts, shard_tokens=50, wait=False) is None
    assert (parts / "shard-0000-of-0002.pt").exists() and not held.exists()
    # the training command waits for it; here "the other process" writes it after a moment
    other = threading.Timer(0.3, lambda: ((cache / "ref" / held.name).rename(held), held.with_suffix(".claim").unlink()))
    other.start()
    got = H.sharded_hidden_states(model, seqs, (8,), parts, shard_tokens=50, poll_s=0.05)
    other.join()
    holder.kill()
    assert all(torch.equal(x, y) for x, y in zip(reference, got)) and len(got) == 3


def test_a_claim_whose_process_died_is_taken_over(cache):
    model, seqs = _model_and_seqs()
    parts = cache / "parts"
    parts.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (parts / "shard-0000-of-0002.claim").write_text(str(dead.pid))
    got = H.sharded_hidden_states(model, seqs, (8,), parts, shard_tokens=50, poll_s=0.05)
    assert [len(h) for h in got] == [40, 23, 51]
    assert not list(parts.glob("*.claim"))


def test_a_process_waiting_when_another_merges_the_shards_reads_the_merged_file(cache, monkeypatch):
    """The race of 2026-12-06: a second training command started while the first was collecting; the
    first merged every shard into KEY.pt and removed the shards' folder, and the second crashed claiming
    a shard in it (FileNotFoundError). It now reads KEY.pt. Negative control: without `merged` it waits on."""
    model, seqs = _model_and_seqs()
    reference = H.sharded_hidden_states(model, seqs, (8,), cache / "ref", shard_tokens=50)
    parts, merged = cache / "KEY.parts", cache / "KEY.pt"
    parts.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    for j in range(2):  # both shards held by a live "other process"
        (parts / f"shard-{j:04d}-of-0002.claim").write_text(str(holder.pid))

    def other_merges():
        torch.save([h for f in sorted((cache / "ref").glob("*.pt")) for h in torch.load(f)], cache / "KEY.tmp")
        (cache / "KEY.tmp").rename(merged)   # as cached_hidden_states writes it: whole or absent
        for f in parts.iterdir():
            f.unlink()
        parts.rmdir()
    monkeypatch.setattr(H, "hidden_states", lambda *a, **k: pytest.fail("a merged shard was recomputed"))
    other = threading.Timer(0.3, other_merges)
    other.start()
    got = H.sharded_hidden_states(model, seqs, (8,), parts, shard_tokens=50, poll_s=0.05, merged=merged)
    other.join()
    assert all(torch.equal(x, y) for x, y in zip(reference, got)) and len(got) == 3
    assert H._claim(parts / "shard-0000-of-0002.pt") is False   # the folder is gone: nothing to claim
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (H.sharded_hidden_states(model, seqs, (8,), cache / "other", shard_tokens=50,
                                                                      poll_s=0.05, wait=True), done.set()), daemon=True)
    (cache / "other").mkdir()
    for j in range(2):
        (cache / "other" / f"shard-{j:04d}-of-0002.claim").write_text(str(holder.pid))
    waiter.start()
    assert not done.wait(0.5)   # negative control: with no merged file to look for, it keeps waiting
    for f in sorted((cache / "ref").glob("*.pt")):   # until the shards themselves come
        f.rename(cache / "other" / f.name)
        (cache / "other" / f.name).with_suffix(".claim").unlink()
    waiter.join(10)
    holder.kill()
    assert done.is_set()


def test_collect_only_collects_every_shard_the_training_command_then_reads(cache, monkeypatch):
    assert H.main(ARGS + ["--out", str(cache / "h"), "--collect-only"]) is None
    assert not (cache / "h" / "model.safetensors").exists()
    monkeypatch.setattr(H, "hidden_states", lambda *a, **k: pytest.fail("a collected shard was recomputed"))
    assert H.main(ARGS + ["--out", str(cache / "h")])["steps"] == 6
    assert not list((cache / "cache").rglob("*.parts"))  # assembled into KEY.pt and cleaned up
