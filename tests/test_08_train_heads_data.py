"""What a head trains on (speclab.train.heads): each prompt once, and no NaN from a batch without targets.

The teacher data holds several answers to one conversation (a greedy one and T=1 samples); they share
the prompt, so only the first answer of a conversation trains on its prompt tokens, the others on
their responses. A batch whose crops all fall inside prompts has no target: its loss is 0 with a
gradient (an empty mean would be NaN and poison the head through the optimiser).
"""

from pathlib import Path

import pytest
import torch

from speclab.train import heads as H


def _fake_teacher(monkeypatch):
    import speclab.train.smollm2_draft as draft
    import speclab.train.teacher as teacher
    ids = ["edit/a#greedy", "edit/a#t1s0", "edit/a#t1s100000", "qa/b#greedy", "qa/b#t1s3"]
    data = {"token_ids": [[1] * 10 for _ in ids], "prompt_lens": [4, 4, 4, 6, 6], "ids": ids,
            "temperature": [0.0, 1.0, 1.0, 0.0, 1.0]}
    monkeypatch.setattr(teacher, "load_teacher_data", lambda: data)
    monkeypatch.setattr(teacher, "teacher_manifest", lambda: {"name": "fake"})
    monkeypatch.setattr(draft, "_is_val", lambda i: False)
    return data


def test_only_the_first_answer_of_a_conversation_trains_on_its_prompt(monkeypatch):
    _fake_teacher(monkeypatch)
    split, loss_from, _ = H.teacher_sequences()
    assert len(split["train"]) == 5
    assert loss_from["train"] == [0, 4, 4, 0, 6]


def test_distinct_conversations_each_train_on_their_prompt(monkeypatch):
    data = _fake_teacher(monkeypatch)
    data["ids"] = [f"s/{i}#greedy" for i in range(5)]          # five conversations: every prompt is new
    assert H.teacher_sequences()[1]["train"] == [0] * 5


def test_teacher_answers_reads_the_first_n_and_keeps_the_held_out_set(monkeypatch):
    """--teacher-answers N: the set grows at its end, so its first N answers are what an earlier head read."""
    import speclab.train.smollm2_draft as draft
    data = _fake_teacher(monkeypatch)
    monkeypatch.setattr(draft, "_is_val", lambda i: i.startswith("qa/"))   # qa/b is held out
    split, loss_from, about = H.teacher_sequences(n_held=1, answers=3)
    assert len(split["train"]) == 3 and split["heldout"] == [] and about["teacher_answers_used"] == 3
    split, _, about = H.teacher_sequences(n_held=1, answers=4)
    assert len(split["train"]) == 3 and len(split["heldout"]) == 1 and about["teacher_answers_used"] == 4
    assert H.teacher_sequences(n_held=1)[2]["teacher_answers_used"] == len(data["ids"])
    with pytest.raises(ValueError, match="holds 5 answers"):
        H.teacher_sequences(answers=6)


def test_a_batch_without_targets_gives_zero_loss_not_nan():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    p = torch.softmax(torch.randn(2, 3, 5), -1)
    none = torch.zeros(2, 3, dtype=torch.bool)
    loss = H.soft_ce(logits, p, none)
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(logits.grad).all()
    some = none.clone()
    some[0, 1] = True
    assert H.soft_ce(logits, p, some).item() > 0
    assert torch.isnan(-(p * torch.log_softmax(logits, -1)).sum(-1)[none].mean()), "the unguarded mean is NaN"


def test_eagle_loss_of_a_batch_without_targets_is_finite():
    from speclab.models.heads import build_head, new_config
    from speclab.models.hub import resolve
    from speclab.models.llama import load_llama
    target = load_llama(resolve("target", "target")[0])
    L, d = target.config.num_hidden_layers, target.config.hidden_size
    stored = (2, L // 2, L)
    head = build_head(new_config("eagle", target, name="target"), target)
    obj = H.Objective(head, target)
    tokens = torch.randint(0, target.config.vocab_size, (2, 9))
    hidden = torch.randn(2, 9, len(stored) * d)
    for lab, zero in ((torch.zeros(2, 9, dtype=torch.bool), True), (torch.ones(2, 9, dtype=torch.bool), False)):
        head.zero_grad()
        loss, _ = H.eagle_loss(head, obj, tokens, hidden, lab, stored, "eagle", ttt=2)
        loss.backward()
        assert (loss.item() == 0.0) == zero and torch.isfinite(loss)
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in head.parameters())


def test_teacher_share_draws_the_answers_that_often():
    # 3 answers and 9 code windows: uniform draws take an answer a quarter of the time, a share of 0.6 as often as asked
    data = {"train": [None] * 12, "about": {"answers_train": 3}}
    assert H.sampling_weights(data, None) is None
    w = H.sampling_weights(data, 0.6)
    pick = torch.multinomial(w, 20000, replacement=True, generator=torch.Generator().manual_seed(0))
    share = (pick < 3).double().mean().item()
    assert abs(share - 0.6) < 0.02, share           # binomial sd 0.0035: 5 sd
    assert (pick < 3).sum() > 0 and (pick >= 3).sum() > 0
    import pytest
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="teacher-share"):
            H.sampling_weights(data, bad)
    assert H.sampling_weights({"train": [None] * 3, "about": {"answers_train": 3}}, 0.6) is None  # no code windows


def test_the_committed_teacher_copy_round_trips(tmp_path):
    from speclab.train import teacher as T
    src = tmp_path / "cache"
    data = {"token_ids": [[1, 2, 3, 49151], [5, 6]], "prompt_lens": [2, 1], "ids": ["qa/x#greedy", "qa/x#t1s0"],
            "temperature": [0.0, 1.0]}
    src.mkdir()
    torch.save(data, src / "teacher.pt")
    (src / "MANIFEST.json").write_text('{"name": "t", "counts": {"answers": 2}}')
    npz = T.save_committed(src, tmp_path / "copy.npz")
    assert (tmp_path / "copy.json").is_file()
    out = T.restore_committed(tmp_path / "restored", npz)
    assert T.load_teacher_data(out) == data
    assert T.teacher_manifest(out) == {"name": "t", "counts": {"answers": 2}}


def test_the_shipped_teacher_copy_is_complete():
    """The committed answers (speclab/data/teacher_smollm2.npz) and their manifest agree."""
    import json
    import numpy as np
    from speclab.train import teacher as T
    z = np.load(T.COMMITTED)
    man = json.loads(T.COMMITTED.with_suffix(".json").read_text())
    assert len(z["ids"]) == len(z["prompt_lens"]) == len(z["temperature"]) == len(z["offsets"]) - 1
    assert man["counts"]["answers"] == len(z["ids"]) == len(set(z["ids"].tolist()))
    lens = np.diff(z["offsets"])
    assert int((lens - z["prompt_lens"]).sum()) == man["tokens"]["response"]
    assert int(z["prompt_lens"].sum()) == man["tokens"]["prompt"]


def test_growing_the_code_windows_collects_only_the_new_ones(tmp_path, monkeypatch):
    """--windows 3 then --windows 5: the second run reads the first run's 3 windows' hidden states from
    its cache and computes only the 2 new ones; what it gets equals a collection from scratch, and the
    held-out windows (the same whatever --windows) are read, not recomputed."""
    monkeypatch.setattr(H, "cache_dir", lambda: tmp_path)
    computed = []

    def fake_hidden_states(model, seqs, layers, max_tokens=4096):
        computed.extend(map(tuple, seqs))
        return [torch.tensor(s, dtype=torch.float16)[:, None] * (layers[0] + 1) for s in seqs]

    monkeypatch.setattr(H, "hidden_states", fake_hidden_states)
    windows = [[i, i + 1, i + 2] for i in range(5)]
    held = [[100, 101, 102]]

    def collect(n):
        key = f"t-code-L2-n{n}-T2-h1"
        srcs = {split: H.code_sources(key, n, split, ws) for split, ws in (("train", windows[:n]), ("heldout", held))}
        return srcs, {split: [h for k, ws, _ in srcs[split] for h in H.cached_hidden_states(None, ws, (2,), k)]
                      for split in srcs}

    collect(3)
    assert sorted(computed) == sorted(map(tuple, windows[:3] + held))
    computed.clear()
    srcs, got = collect(5)
    assert [k for k, _, _ in srcs["train"]] == ["t-code-L2-n3-T2-h1.train", "t-code-L2-n5-from3-T2-h1.train"]
    assert [k for k, _, _ in srcs["heldout"]] == ["t-code-L2-n3-T2-h1.heldout"]
    assert computed == [tuple(w) for w in windows[3:]]  # only the new windows
    fresh = fake_hidden_states(None, windows, (2,))
    assert len(got["train"]) == 5 and all(torch.equal(a, b) for a, b in zip(got["train"], fresh))
    # shrinking, or asking again, computes nothing
    computed.clear()
    collect(5), collect(2)
    assert computed == [tuple(w) for w in windows[:2]]  # --windows 2 has no smaller cache: its own


@pytest.mark.slow
def test_token_windows_draws_the_same_first_windows_whatever_the_number():
    """What code_sources relies on to reuse a smaller run's cache (slow: tokenizes the whole corpus, 5-15 s)."""
    from speclab.data.corpus import token_windows
    tok = Path(H.__file__).parents[1] / "checkpoints" / "draft"
    a, b = token_windows(tok, 20, 3, 16), token_windows(tok, 50, 3, 16)
    assert a["train"] == b["train"][:20] and a["heldout"] == b["heldout"]
    assert b["train"][20:] != b["train"][:30]  # more windows are new windows, not a repeat


def test_a_grown_teacher_set_computes_only_its_new_answers(monkeypatch, tmp_path):
    """Hidden states cached for the first M answers are reused for N > M: only answers M.. are computed
    (-aN-fromM-); a cache that is not a prefix of the current set (another teacher set) is not used."""
    _fake_teacher(monkeypatch)
    monkeypatch.setattr(H, "cache_dir", lambda: tmp_path)
    split, plens, _ = H.teacher_sequences(answers=5)
    stem = "smollm2-teacher-L30"
    assert H.teacher_sources(f"{stem}-a5", "train", split["train"], plens["train"]) == \
        [(f"{stem}-a5.train", split["train"], plens["train"])]                  # nothing cached: all of it
    (tmp_path / f"{stem}-a3.train.pt").write_bytes(b"")
    (tmp_path / f"{stem}-a4-from3.train.pt").write_bytes(b"")                     # a partial key is never a base
    got = H.teacher_sources(f"{stem}-a5", "train", split["train"], plens["train"])
    assert got == [(f"{stem}-a3.train", split["train"][:3], plens["train"][:3]),
                   (f"{stem}-a5-from3.train", split["train"][3:], plens["train"][3:])]
    other = [[2] * 10] + split["train"][1:]                                      # the cached set's first answer differs
    assert H.teacher_sources(f"{stem}-a5", "train", other, plens["train"]) == [(f"{stem}-a5.train", other, plens["train"])]
    (tmp_path / f"{stem}-a3.train.pt").unlink()                                   # a --collect-only helper's shards:
    (tmp_path / f"{stem}-a3.train.parts").mkdir()
    (tmp_path / f"{stem}-a3.train.parts" / "shard-0000-of-0002.pt").write_bytes(b"")
    assert len(H.teacher_sources(f"{stem}-a5", "train", split["train"], plens["train"])) == 1   # one of two: not yet
    (tmp_path / f"{stem}-a3.train.parts" / "shard-0001-of-0002.pt").write_bytes(b"")
    assert H.teacher_sources(f"{stem}-a5", "train", split["train"], plens["train"]) == got     # all of them: reused
    (tmp_path / f"{stem}-a5.train.pt").write_bytes(b"")
    assert H.teacher_sources(f"{stem}-a5", "train", split["train"], plens["train"])[0][0] == f"{stem}-a5.train"
