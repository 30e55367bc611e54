"""Train the draft heads of lesson 08 on a frozen target's hidden states, on the CPU.

    python -m speclab.train.heads --method eagle              # the embedded target (minutes)
    python -m speclab.train.heads --method eagle3 | mtp | medusa
    python -m speclab.train.heads --method eagle --target smollm2 --draft-vocab 8192 --minutes 35

The target's hidden states are collected once, with speclab's own paged forward (the same math
that serves them at inference), and cached under $SPECLAB_CACHE/heads/, so every family reuses them:
the embedded target's on windows of the corpus' train split (held-out modules for evaluation), the
real model's on its own responses to training prompts (smollm2-teacher-v1, written by
`speclab.train.teacher`; held out by source, as the SmolLM2 draft's distillation splits them).

Losses, at position t with input (x_{t+1}, f_t) and the target's next feature f_{t+1} and
distribution p_{t+1} (of x_{t+2}, through its own final norm and LM head):
  - eagle:  SmoothL1(g / s, f_{t+1} / s) + 0.1 * CE(p_{t+1}, q)   (Li et al. 2024, w_cls = 0.1; s: the
            features' RMS, so that regression and cross-entropy weigh alike on any target)
  - eagle3: CE(p_{t+1}, q) over fused low/mid/top features, with training-time test: steps 2..n feed
            the head's own outputs back as in chain drafting (Li et al. 2025), weights 0.8^j
  - mtp:    CE on the data's own token x_{t+2} (DeepSeek-V3's L_MTP, a hard label)
  - medusa: head i: CE(p_{t+i}, q_i) for x_{t+i+1} from h_t (self-distillation, Cai et al. 2024)
Each run writes the head directory (config.json, model.safetensors, MANIFEST.json with the figures
and the command that reproduces it) and a log; a progress bar shows the loss.

Long runs stop and resume. Every --checkpoint-minutes (default 5) the head, the optimiser, the step,
the data generator's state and the minutes trained so far go to $SPECLAB_CACHE/heads/runs/NAME/
checkpoint.pt; Ctrl-C (or SIGTERM) writes one more and exits. The same command with --resume goes on
from it: the time budget counts the minutes already trained, so the cosine ends where it would have.
The hidden states are collected in shards of about 100k tokens, each saved as it is done, so a
stopped collection resumes too. On two cores, collect on both: start the same command with
--collect-only --threads 1 beside the training command (also --threads 1); the two share the shards
(each claims the ones it computes), the helper exits when none is left, and the training command
waits for the helper's last shards, then trains:

    python -m speclab.train.heads --method eagle --target smollm2 --windows 2000 --threads 1 --collect-only &
    python -m speclab.train.heads --method eagle --target smollm2 --windows 2000 --threads 1 --minutes 50
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from speclab.engine.batch import flatten
from speclab.kv_cache import KVCacheManager
from speclab.models.heads.eagle import ttt_mask
from speclab.models.heads import HEADS_DIR, build_head, new_config, save_head
from speclab.cpu_info import cpu_name
from speclab.data.corpus import token_windows
from speclab.train.resumable import Stop, save_atomic

DEFAULTS = {  # method -> (loss, training-time-test steps)
    "eagle": dict(ttt=1), "eagle3": dict(ttt=3), "mtp": dict(ttt=1), "medusa": dict(ttt=1),
}


# ----------------------------------------------------------------------------------------------
# data: token sequences and the target's hidden states, collected once


def cache_dir() -> Path:
    from speclab.models.smollm2 import cache_root
    return cache_root() / "heads"


@torch.inference_mode()
def hidden_states(model, seqs: list[list[int]], layers: tuple[int, ...], max_tokens: int = 4096) -> list[torch.Tensor]:
    """The target's outputs of `layers` at every position of every sequence: (n, len(layers) * d)
    float16 each, from speclab's paged forward over ragged batches of about max_tokens tokens."""
    out, i = [], 0
    bar = tqdm(total=sum(map(len, seqs)), desc="hidden states", unit="tok", mininterval=5)
    while i < len(seqs):
        batch = [seqs[i]]
        while i + len(batch) < len(seqs) and sum(map(len, batch)) + len(seqs[i + len(batch)]) <= max_tokens:
            batch.append(seqs[i + len(batch)])
        bs = 64
        kv = KVCacheManager(sum(math.ceil(len(s) / bs) for s in batch), bs)
        for j, s in enumerate(batch):
            kv.allocate(str(j), 0, len(s))
        caches = model.allocate_kv_cache(kv.pool.num_blocks, bs)
        ids, meta = flatten(kv, [(str(j), s, 0) for j, s in enumerate(batch)])
        _, saved = model(ids, meta, caches, layers)
        h = torch.cat(saved, -1).half()
        out += list(h.split([len(s) for s in batch]))
        bar.update(sum(map(len, batch)))
        i += len(batch)
    bar.close()
    return out


def embedded_sequences(n_train: int, n_held: int, seq_len: int, seed: int = 0):
    """Windows of seq_len + 1 tokens from the corpus' train split and its held-out modules."""
    import numpy as np
    from tokenizers import Tokenizer

    from speclab.data.corpus import collect
    from speclab.models.hub import checkpoint_dir
    tok = Tokenizer.from_file(str(checkpoint_dir("target") / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    files = collect()
    out = {}
    for split, n in (("train", n_train), ("heldout", n_held)):
        ids = []
        for enc in tok.encode_batch([f.text for f in files if f.split == split]):
            ids += enc.ids + [eos]
        ids = np.asarray(ids)
        rng = np.random.default_rng(seed + (split == "heldout"))
        starts = rng.integers(0, len(ids) - seq_len - 1, n)
        out[split] = [ids[s:s + seq_len + 1].tolist() for s in starts]
    return out, {"source": "windows of the embedded pair's corpus (stdlib train split; held-out modules for eval)",
                 "seq_len": seq_len + 1, "windows": {"train": n_train, "heldout": n_held}}


def teacher_sequences(n_held: int = 24, max_len: int = 640, answers: int | None = None):
    """The real model's own responses (chat-templated prompt + response ids), split as the SmolLM2
    draft's distillation splits them (by source, `smollm2_draft._is_val`): no held-out source, nor
    another answer to the same conversation, is trained on; the first n_held of them are evaluated.

    `answers`: only the first N answers (the teacher set only ever grows at its end, so the first 1,152
    are the set the shipped heads trained on, and the held-out answers are the same for any N)."""
    from speclab.train.smollm2_draft import _is_val
    from speclab.train.teacher import load_teacher_data, teacher_dir, teacher_manifest
    d, man = load_teacher_data(), teacher_manifest()
    if answers is not None:
        if not 0 < answers <= len(d["ids"]):
            raise ValueError(f"--teacher-answers {answers}: the teacher set holds {len(d['ids'])} answers "
                             f"(grow it with `python -m speclab.train.teacher --resume --samples N`)")
        d = {k: v[:answers] for k, v in d.items()}
    val = [_is_val(i) for i in d["ids"]]
    seqs = [list(s)[:max_len] for s in d["token_ids"]]
    lens = list(d["prompt_lens"])
    held = [i for i, v in enumerate(val) if v][:n_held]
    train = [i for i, v in enumerate(val) if not v]
    split = {"train": [seqs[i] for i in train], "heldout": [seqs[i] for i in held]}
    # a prompt is trained on with its first answer only: the conversation's other answers (more T=1
    # samples) share it, and would otherwise weigh each prompt as often as it was answered
    first, seen = [], set()
    for i in train:
        conv = d["ids"][i].split("#")[0]
        first.append(conv not in seen)
        seen.add(conv)
    loss_from = {"train": [0 if f else lens[i] for f, i in zip(first, train)],
                 "heldout": [lens[i] for i in held]}  # held out: responses only
    about = {"source": str(teacher_dir()), "teacher": {k: man.get(k) for k in ("name", "counts", "tokens", "command")},
             "teacher_answers_used": len(d["ids"]),
             "conversations": {"train": len(train), "heldout": len(held), "unused_validation": sum(val) - len(held)},
             "split": "by source, as speclab.train.smollm2_draft._is_val"}
    return split, loss_from, about


def load_data(target_name: str, model, layers: tuple[int, ...], args) -> dict | None:
    """{'train': [(tokens, hidden, loss_from)], 'heldout': [...], 'about': {...}}, cached on disk
    (None with args.collect_only: this process only helps collect the hidden states, see
    sharded_hidden_states).

    For smollm2 the two sources are cached apart, so that growing one (more teacher answers, more code
    windows) does not recompute the other: the teacher answers first, then the code windows, in each split.
    More code windows than a cached run had compute only the new ones (code_sources)."""
    L = "-".join(map(str, layers))
    if target_name != "smollm2":
        held = args.heldout_windows or max(16, args.windows // 12)
        seqs, about = embedded_sequences(args.windows, held, args.seq_len)
        key = f"{target_name}-L{L}-n{args.windows}-T{args.seq_len}" + (f"-h{args.heldout_windows}" if args.heldout_windows else "")
        sources = {split: [(f"{key}.{split}", seqs[split], [0] * len(seqs[split]))] for split in ("train", "heldout")}
    else:  # its own answers, and code it reads (disjoint from the held-out chat sets)
        from speclab.models.smollm2 import model_dir
        seqs, plens, about = teacher_sequences(answers=getattr(args, "teacher_answers", None))
        held = args.heldout_windows or max(4, args.windows // 12)
        code = token_windows(model_dir(), args.windows, held, args.seq_len)
        about["code_windows"] = {"source": "stdlib corpus, train split (held-out modules for eval)",
                                 "tokens_each": args.seq_len + 1, "train": args.windows, "heldout": held}
        about["answers_train"] = len(seqs["train"])  # data["train"][:answers_train]: the teacher's
        tkey = f"{target_name}-teacher-L{L}-a{about['teacher_answers_used']}"
        ckey = f"{target_name}-code-L{L}-n{args.windows}-T{args.seq_len}-h{held}"
        sources = {split: teacher_sources(tkey, split, seqs[split], plens[split])
                   + code_sources(ckey, args.windows, split, code[split]) for split in ("train", "heldout")}
    if getattr(args, "collect_only", False):
        for split in ("train", "heldout"):
            for key, ss, _ in sources[split]:
                cached_hidden_states(model, ss, layers, key, collect_only=True)
        return None
    data = {"about": {**about, "layers": list(layers)}}
    for split in ("train", "heldout"):
        data[split] = [(torch.tensor(s), h, pl) for key, ss, pls in sources[split]
                       for s, h, pl in zip(ss, cached_hidden_states(model, ss, layers, key), pls)]
    data["about"]["tokens"] = {k: sum(len(s) for s, _, _ in data[k]) for k in ("train", "heldout")}
    return data


def collected(name: str) -> bool:
    """Whether the hidden states of cache key `name` (KEY.SPLIT) are all on disk: merged (NAME.pt), or as
    every shard of a collection (NAME.parts/, which a --collect-only helper leaves unmerged)."""
    if (cache_dir() / f"{name}.pt").exists():
        return True
    shards = list((cache_dir() / f"{name}.parts").glob("shard-*-of-*.pt"))
    return bool(shards) and len(shards) == int(shards[0].stem.rsplit("-of-", 1)[1])


def teacher_sources(key: str, split: str, seqs: list[list[int]], plens: list[int]) -> list[tuple[str, list[list[int]], list[int]]]:
    """The teacher answers' cache keys, [(KEY.SPLIT, sequences, loss_from)], reusing the hidden states
    collected for a smaller teacher set (-aM- in the key): the set grows only at its end, so the first M
    answers' sequences of a split are a prefix of the N answers' (checked), and only the rest is computed
    (cached as -aN-fromM-). A grown held-out split keeps its first 24 answers, so it is never recomputed."""
    n = int(key.rsplit("-a", 1)[1])
    whole = [(f"{key}.{split}", seqs, plens)]
    if collected(f"{key}.{split}"):
        return whole
    stem = key.rsplit("-a", 1)[0]
    counts = {f.name[len(stem) + 2:].split(".", 1)[0] for f in cache_dir().glob(f"{stem}-a*.{split}.*")}
    smaller = sorted(int(m) for m in counts if m.isdigit() and int(m) < n and collected(f"{stem}-a{m}.{split}"))
    if not smaller:
        return whole
    m = smaller[-1]
    prev = teacher_sequences(answers=m)[0][split]
    if seqs[:len(prev)] != prev:  # not a prefix (another teacher set in the cache): compute it all
        return whole
    if len(prev) == len(seqs):
        return [(f"{stem}-a{m}.{split}", seqs, plens)]
    k = len(prev)
    return [(f"{stem}-a{m}.{split}", seqs[:k], plens[:k]), (f"{key}-from{m}.{split}", seqs[k:], plens[k:])]


def code_sources(key: str, n: int, split: str, windows: list[list[int]]) -> list[tuple[str, list[list[int]], list[int]]]:
    """The code windows' cache keys, [(KEY.SPLIT, windows, loss_from)], reusing what a run with another
    --windows (-nM- in the key) collected: token_windows draws the same first M training windows whatever
    the number asked for, and the same held-out windows. So growing --windows from M to N computes only
    the N - M new windows' hidden states (cached as -nN-fromM-), and the held-out set is never recomputed."""
    def cached(m: int) -> bool:
        return (cache_dir() / f"{key.replace(f'-n{n}-', f'-n{m}-')}.{split}.pt").exists()

    others = sorted(int(f.name.split("-n", 1)[1].split("-", 1)[0])
                    for f in cache_dir().glob(f"{key.replace(f'-n{n}-', '-n*-')}.{split}.pt") if "-from" not in f.name)
    if split == "heldout" and not cached(n) and others:
        return [(f"{key.replace(f'-n{n}-', f'-n{others[-1]}-')}.{split}", windows, [0] * len(windows))]
    m = max((m for m in others if m < n), default=0)
    if split == "heldout" or cached(n) or not m:
        return [(f"{key}.{split}", windows, [0] * len(windows))]
    return [(f"{key.replace(f'-n{n}-', f'-n{m}-')}.{split}", windows[:m], [0] * m),
            (f"{key.replace(f'-n{n}-', f'-n{n}-from{m}-')}.{split}", windows[m:], [0] * (n - m))]


def cached_hidden_states(model, seqs: list[list[int]], layers: tuple[int, ...], key: str,
                         collect_only: bool = False) -> list[torch.Tensor] | None:
    """hidden_states of `seqs`, saved once as cache_dir()/KEY.pt (complete or absent) and read back
    after; collected in resumable shards (sharded_hidden_states) under KEY.parts/. With collect_only,
    only compute the shards no other process holds, and return None (see sharded_hidden_states)."""
    path = cache_dir() / f"{key}.pt"
    if path.exists():
        return None if collect_only else torch.load(path)
    parts = cache_dir() / f"{key}.parts"
    hs = sharded_hidden_states(model, seqs, layers, parts, wait=not collect_only, merged=path)
    if collect_only or path.exists():  # (exists: another process merged the shards first and removed them)
        return None if collect_only else hs
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(hs, tmp)
    tmp.rename(path)
    for f in parts.glob("*.pt"):
        f.unlink(missing_ok=True)
    try:
        parts.rmdir()
    except OSError:
        pass  # a --collect-only process still has a claim file there; it leaves when it sees KEY.pt
    return hs


def sharded_hidden_states(model, seqs: list[list[int]], layers: tuple[int, ...], parts: Path,
                          shard_tokens: int = 100_000, wait: bool = True, poll_s: float = 10.0,
                          merged: Path | None = None) -> list[torch.Tensor] | None:
    """hidden_states over shards of about shard_tokens tokens, each saved under `parts` when done and
    read back instead of recomputed: a collection stopped half way resumes where it stopped.

    Several processes may collect at once, one per core: each shard is claimed by a file naming its
    process (SHARD.claim), and a process computes only the shards no live process holds; a claim
    whose process has died is taken over. With `wait`, it then waits for the others' shards and
    returns them all; without (`--collect-only`), it returns None once nothing is left to claim. When
    `merged` (the complete KEY.pt) appears, another process has merged every shard and removed `parts`:
    it is read instead (a process started just before that merge once crashed claiming in the removed folder)."""
    parts.mkdir(parents=True, exist_ok=True)
    shards, start, n = [], 0, 0
    for i, s in enumerate(seqs):
        n += len(s)
        if n >= shard_tokens or i == len(seqs) - 1:
            shards.append((start, i + 1))
            start, n = i + 1, 0
    files = [parts / f"shard-{j:04d}-of-{len(shards):04d}.pt" for j in range(len(shards))]
    while True:
        if merged is not None and merged.exists():
            return torch.load(merged) if wait else None
        for f, (a, b) in zip(files, shards):
            if f.exists() or not _claim(f):
                continue
            try:
                hs = hidden_states(model, seqs[a:b], layers)
                torch.save(hs, f.with_suffix(".tmp"))
                f.with_suffix(".tmp").rename(f)
            finally:
                f.with_suffix(".claim").unlink(missing_ok=True)
        if not wait:
            return None
        if all(f.exists() for f in files):
            return [h for f in files for h in torch.load(f)]
        time.sleep(poll_s)  # shards that another live process is computing


def _claim(shard: Path) -> bool:
    """Claim `shard` for this process (SHARD.claim holds its pid); False when a live process holds it.
    A claim whose process has died is taken over (an empty one, once it is a minute old)."""
    claim = shard.with_suffix(".claim")
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileNotFoundError:
            return False  # the shards' folder is gone: another process merged them (sharded_hidden_states)
        except FileExistsError:
            try:
                text, age = claim.read_text(), time.time() - claim.stat().st_mtime
            except FileNotFoundError:
                continue  # just released: try again
            if text.strip().isdigit() and _alive(int(text)) or not text.strip() and age < 60:
                return False
            claim.unlink(missing_ok=True)  # its process died: take it over
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return True
    return False


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists (a claim's holder)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def labels_mask(n: int, length: int, loss_from: int) -> torch.Tensor:
    """(n,) True at the token positions u that are loss targets: inside the sequence, in the response."""
    u = torch.arange(n)
    return (u < length) & (u >= loss_from)


def batch(items, gen: torch.Generator, B: int, T: int, weights: torch.Tensor | None = None):
    """B random sequences (uniformly, or in proportion to `weights`), each a random crop of at most
    T + 1 tokens: tokens (B, n) (padded with 0), hidden (B, n, H) float32, lab (B, n): which tokens are
    loss targets."""
    if weights is None:
        pick = torch.randint(0, len(items), (B,), generator=gen).tolist()
    else:
        pick = torch.multinomial(weights, B, replacement=True, generator=gen).tolist()
    rows = []
    for i in pick:
        toks, h, loss_from = items[i]
        s = int(torch.randint(0, max(1, len(toks) - T), (1,), generator=gen))
        rows.append((toks[s:s + T + 1], h[s:s + T + 1].float(), loss_from - s))
    n = max(len(t) for t, _, _ in rows)
    tokens = torch.zeros(B, n, dtype=torch.long)
    hidden = torch.zeros(B, n, rows[0][1].shape[-1])
    lab = torch.stack([labels_mask(n, len(t), lf) for t, _, lf in rows])
    for b, (t, h, _) in enumerate(rows):
        tokens[b, :len(t)], hidden[b, :len(t)] = t, h
    return tokens, hidden, lab


# ----------------------------------------------------------------------------------------------
# losses


def soft_ce(logits: torch.Tensor, p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over masked rows of -sum p log softmax(logits): (B, T, V), (B, T, V), (B, T); 0 (with a
    gradient) when no row is masked in, as when every crop of a batch fell inside a prompt."""
    if not mask.any():
        return logits.sum() * 0.0
    return -(p * F.log_softmax(logits, -1)).sum(-1)[mask].mean()


class Objective:
    """The target's frozen pieces, with an optional draft vocabulary, used by every family's loss."""

    def __init__(self, head, target):
        self.head, self.target = head, target
        self.sub = head.d2t if getattr(head, "d2t", None) is not None else None
        w = target.lm_head.weight.detach()
        self.w = w if self.sub is None else w.index_select(0, self.sub)  # (V', d)
        self.scale = 1.0  # features' RMS, set from the data

    def logits(self, g):  # head output / target feature (.., d) -> (.., V') logits
        return F.linear(self.target.model.norm(g), self.w)

    def target_probs(self, f):
        with torch.no_grad():
            return F.softmax(self.logits(f), -1)


def column_block(hidden: torch.Tensor, stored: tuple[int, ...], wanted: tuple[int, ...]) -> torch.Tensor:
    """The columns of `wanted` layers out of hidden (.., len(stored) * d)."""
    d = hidden.shape[-1] // len(stored)
    return torch.cat([hidden[..., stored.index(i) * d:(stored.index(i) + 1) * d] for i in wanted], -1)


def eagle_loss(head, obj: Objective, tokens, hidden, lab, stored, method: str, ttt: int):
    """Losses of EAGLE / EAGLE-3-style / MTP heads, unrolled over `ttt` chained steps."""
    L = head.cfg.target["num_hidden_layers"]
    feats = column_block(hidden, stored, head.cfg.hidden_layers)  # (B, T+1, n*d)
    top = column_block(hidden, stored, (L,))  # (B, T+1, d)
    T = tokens.shape[1] - 1
    x_next, f_t, f_next = tokens[:, 1:T], head.features(feats[:, :T - 1]), top[:, 1:T]  # (B, T-1, ..)
    p = None if method == "mtp" else obj.target_probs(f_next)  # (B, T-1, V')
    labels, mask = tokens[:, 2:T + 1], lab[:, 2:T + 1]  # x_{t+2}, and whether it is a target
    if method == "mtp" and obj.sub is not None:
        raise ValueError("mtp trains on hard labels over the whole vocabulary: no draft vocabulary")
    positions = torch.arange(T - 1)
    past, total, parts = [], 0.0, {}
    for j in range(1, ttt + 1):
        g, kv = head.dense(x_next, f_t, positions, ttt_mask(T - 1, j), past)
        m = mask.clone()
        m[:, :j - 1] = False
        logits = obj.logits(g)
        if not m.any():  # every crop of the batch fell inside prompts: nothing to learn at this step
            loss = g.sum() * 0.0
        elif method == "mtp":
            loss = F.cross_entropy(logits[m], labels[m])
        else:
            loss = soft_ce(logits, p, m)
        if method == "eagle" and m.any():  # in units of the features' RMS (the residual stream of a small model runs to ~500)
            reg = F.smooth_l1_loss(g[m] / obj.scale, f_next[m] / obj.scale)
            parts[f"reg{j}"] = reg.item()
            loss = reg + 0.1 * loss
        parts[f"loss{j}"] = loss.item()
        total = total + 0.8 ** (j - 1) * loss
        past.append(kv)
        f_t = torch.cat([g[:, :1], g[:, :-1]], 1)  # step j+1 at t reads step j's output at t - 1
    return total, parts


def medusa_loss(head, obj: Objective, tokens, hidden, lab, stored):
    L = head.cfg.target["num_hidden_layers"]
    top = column_block(hidden, stored, (L,))  # (B, n, d)
    n = tokens.shape[1]
    total, parts = 0.0, {}
    for i, block in enumerate(head.blocks, start=1):  # head i on h_t guesses x_{t+1+i}: target p at t + i
        m = n - 1 - i
        logits = F.linear(block(head.target.model.norm(top[:, :m])), obj.w)
        loss = soft_ce(logits, obj.target_probs(top[:, i:i + m]), lab[:, 1 + i:n])
        parts[f"loss{i}"] = loss.item()
        total = total + loss
    return total, parts


# ----------------------------------------------------------------------------------------------
# evaluation: teacher-forced acceptance per chained position


@torch.no_grad()
def evaluate(head, target, items, stored, method: str, depth: int = 4, T: int = 256) -> dict:
    """Per chained position j (1 = from the target's own feature, j > 1 = after j-1 of the head's own
    outputs, with the true tokens): top-1 agreement with the target's argmax (greedy acceptance), how
    often that argmax is among the head's top 3 (what a tree 3 wide at that depth keeps) and
    mean sum min(p, q) at temperature 1 (the acceptance of sampled drafts), over held-out positions."""
    obj = Objective(head, target)
    obj.w = target.lm_head.weight  # evaluate over the full vocabulary, as verification does
    agree, top3, overlap, count = [0.0] * depth, [0.0] * depth, [0.0] * depth, [0] * depth
    in_top3 = lambda p, q: (q.topk(3, -1).indices == p.argmax(-1, keepdim=True)).any(-1)  # noqa: E731
    for toks, h, lf in items:
        tokens, hidden = toks[None, :T + 1], h[None, :T + 1].float()
        n = tokens.shape[1]
        lab = labels_mask(n, n, lf)[None]
        L = head.cfg.target["num_hidden_layers"]
        top = column_block(hidden, stored, (L,))
        if method == "medusa":
            for i in range(1, min(depth, len(head.blocks)) + 1):
                m = n - 1 - i
                p = F.softmax(F.linear(target.model.norm(top[:, i:i + m]), obj.w), -1)
                q = F.softmax(head(top[:, :m], i)[i - 1], -1)
                sel = lab[:, 1 + i:n]
                agree[i - 1] += (p.argmax(-1) == q.argmax(-1))[sel].sum().item()
                top3[i - 1] += in_top3(p, q)[sel].sum().item()
                overlap[i - 1] += torch.minimum(p, q).sum(-1)[sel].sum().item()
                count[i - 1] += int(sel.sum())
            continue
        Tm = n - 1
        f_t = head.features(column_block(hidden, stored, head.cfg.hidden_layers)[:, :Tm - 1])
        p = F.softmax(F.linear(target.model.norm(top[:, 1:Tm]), obj.w), -1)
        past = []
        for j in range(1, depth + 1):
            g, kv = head.dense(tokens[:, 1:Tm], f_t, torch.arange(Tm - 1), ttt_mask(Tm - 1, j), past)
            q = F.softmax(head.logits(g[0]), -1)[None]
            sel = lab[:, 2:n].clone()
            sel[:, :j - 1] = False
            agree[j - 1] += (p.argmax(-1) == q.argmax(-1))[sel].sum().item()
            top3[j - 1] += in_top3(p, q)[sel].sum().item()
            overlap[j - 1] += torch.minimum(p, q).sum(-1)[sel].sum().item()
            count[j - 1] += int(sel.sum())
            past.append(kv)
            f_t = torch.cat([g[:, :1], g[:, :-1]], 1)
    r = lambda xs: [round(a / max(c, 1), 4) for a, c in zip(xs, count)]  # noqa: E731
    return {"top1_agreement_per_position": r(agree), "top3_agreement_per_position": r(top3),
            "sum_min_pq_per_position": r(overlap),
            "positions_evaluated": count[0]}


def frequent_tokens(items, V: int, n: int) -> torch.Tensor:
    """The n most frequent tokens of the training sequences (EAGLE-3's d2t), sorted by id."""
    counts = torch.zeros(V, dtype=torch.long)
    for toks, _, _ in items:
        counts += torch.bincount(toks, minlength=V)
    return counts.topk(n).indices.sort().values


# ----------------------------------------------------------------------------------------------
# the run


@torch.no_grad()
def widen_mlp(head, intermediate_size: int, target, gen: torch.Generator):
    """The EAGLE head `head` with its decoder layer's MLP widened to `intermediate_size`, computing the
    same function (Net2Net's idea, Chen et al. 2016): the new units' gate and up rows start as a fresh
    Linear's, their down_proj columns at zero, so they add nothing until training moves them.
    Every other weight is copied. Returns a new head (train mode)."""
    old = head.cfg.layer["intermediate_size"]
    if intermediate_size < old:
        raise ValueError(f"--intermediate-size {intermediate_size}: narrower than the head's {old}; "
                         f"widening keeps every trained unit")
    cfg = copy.deepcopy(head.cfg)
    cfg.layer["intermediate_size"] = intermediate_size
    wide = build_head(cfg, target).to(head.fc.weight.dtype)
    state = head.state_dict()
    for name in ("gate_proj", "up_proj"):
        w = getattr(wide.layer.mlp, name).weight  # (I_new, d): fresh rows below the copied ones
        bound = 1 / math.sqrt(w.shape[1])
        w[old:] = torch.empty_like(w[old:]).uniform_(-bound, bound, generator=gen)
        state[f"layer.mlp.{name}.weight"] = torch.cat([state[f"layer.mlp.{name}.weight"], w[old:]])
    down = state["layer.mlp.down_proj.weight"]  # (d, I): zero columns for the new units
    state["layer.mlp.down_proj.weight"] = torch.cat([down, down.new_zeros(down.shape[0], intermediate_size - old)], 1)
    wide.load_state_dict(state)
    return wide.train()


@torch.no_grad()
def identity_init(head) -> None:
    """Start with g ~ f_t (the feature passed through; the top layer picked out of a fusion): the
    residual stream changes little from one position to the next, so regression starts near its goal."""
    D = head.cfg.target["hidden_size"]
    head.fc.weight[:, D:] = torch.eye(D)
    if head.fuse is not None:
        head.fuse.weight.zero_()
        head.fuse.weight[:, -D:] = torch.eye(D)


@dataclass
class _Fit:
    """What the training loop did, for the manifest."""
    steps: int
    final_loss_ema: float
    minutes: float
    parameters: int
    ttt: int
    feature_rms: float
    load_average: list[float]  # the 1-minute load average at each log line
    resumed: int  # how many times the run was resumed from a checkpoint


def _logger(log_path: Path) -> Callable[[str], None]:
    """A log function: each line time-stamped, to stderr and appended to `log_path`."""
    def log(msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        with open(log_path, "a") as fh:
            fh.write(line + "\n")
    return log


def _out_and_log(args) -> tuple[Path, Callable[[str], None]]:
    """The head directory (--out, else HEADS_DIR/NAME) and the log function (--log, else the cache's)."""
    out = Path(args.out) if args.out else HEADS_DIR / (args.method if args.target == "target" else f"{args.method}-{args.target}")
    log_path = Path(args.log) if args.log else cache_dir() / f"train-{out.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return out, _logger(log_path)


def _target_and_data(args, log, t0: float):
    """The frozen target, the layers whose hidden states are stored, and the (cached) data."""
    from speclab.models.hub import resolve
    from speclab.models.llama import load_llama

    target = load_llama(resolve(args.target, "target")[0])
    for p in target.parameters():
        p.requires_grad_(False)
    L = target.config.num_hidden_layers
    stored = (2, L // 2, L) if args.target == "target" else (L,)
    data = load_data(args.target, target, stored, args)
    if data is not None:
        log(f"data: {data['about']}; {time.time() - t0:.0f}s")
    return target, stored, data


def _new_head(args, target, stored: tuple[int, ...], data: dict, log):
    """The head's config and the head: continued from --init, or new (draft vocabulary, initialisation)."""
    layers = tuple(map(int, args.hidden_layers.split(","))) if args.hidden_layers else None
    if layers and not set(layers) <= set(stored):
        raise ValueError(f"--hidden-layers {args.hidden_layers}: the cached hidden states hold layers {stored}")
    wide = getattr(args, "intermediate_size", None)
    if wide and args.method not in ("eagle", "eagle3"):
        raise ValueError(f"--intermediate-size is for an EAGLE head's decoder layer, not {args.method}")
    cfg = new_config(args.method, target, name=args.target, hidden_layers=layers,
                     num_heads=args.medusa_heads if args.method == "medusa" else 0, draft_vocab_size=args.draft_vocab or None,
                     intermediate_size=wide)
    head = build_head(cfg, target)
    earlier = None
    if args.init:  # continue an earlier run of the same method and target
        from speclab.models.heads import load_head
        head = load_head(args.init, target, method=args.method).train()
        earlier = json.loads((Path(args.init) / "MANIFEST.json").read_text())
        log(f"continuing {args.init} after its {earlier['steps']} steps")
        if wide and wide != head.cfg.layer["intermediate_size"]:
            log(f"MLP widened from {head.cfg.layer['intermediate_size']} to {wide}, drafting as before")
            head = widen_mlp(head, wide, target, torch.Generator().manual_seed(args.seed))
        cfg = head.cfg
    elif args.draft_vocab:
        head.d2t.copy_(frequent_tokens(data["train"], target.config.vocab_size, args.draft_vocab))
    if args.method in ("eagle", "eagle3") and not args.init:
        identity_init(head)
        if args.layer_init is not None:  # the decoder layer starts as one of the target's (shapes agree)
            head.layer.load_state_dict(target.model.layers[args.layer_init].state_dict())
            log(f"decoder layer initialised from the target's layer {args.layer_init}")
    return cfg, head, earlier


def _objective(head, target, stored: tuple[int, ...], data: dict) -> Objective:
    """The loss's frozen target pieces, with the features' RMS measured on the first training sequences."""
    L = target.config.num_hidden_layers
    obj = Objective(head, target)
    top = torch.cat([column_block(h[:256], stored, (L,)).float() for _, h, _ in data["train"][:64]])
    obj.scale = float(top.pow(2).mean().sqrt())
    return obj


def sampling_weights(data: dict, teacher_share: float | None) -> torch.Tensor | None:
    """Per training sequence, the weight that makes the teacher's answers (data["train"][:answers_train])
    `teacher_share` of the sequences drawn, the code windows the rest; None (uniform) without a share."""
    n_t = data["about"].get("answers_train")
    if teacher_share is None or n_t is None:
        return None
    if not 0 < teacher_share < 1:
        raise ValueError(f"--teacher-share {teacher_share}: a fraction strictly between 0 and 1")
    n_c = len(data["train"]) - n_t
    if n_c == 0:
        return None
    return torch.tensor([teacher_share / n_t] * n_t + [(1 - teacher_share) / n_c] * n_c, dtype=torch.double)


def _lr(args, step: int, progress: float) -> float:
    """Linear warmup over --warmup steps, then a cosine from --lr to a tenth of it as progress reaches 1."""
    return args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1))))


def run_dir(out: Path) -> Path:
    """Where a run's checkpoint lives: $SPECLAB_CACHE/heads/runs/NAME (NAME: the head directory's)."""
    return cache_dir() / "runs" / out.name


def _checkpoint(path: Path, head, opt, gen: torch.Generator, state: dict) -> None:
    """Write the run's state atomically: a stop in the middle leaves the previous checkpoint."""
    save_atomic(path, {"head": head.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(), **state})


def _train(args, cfg, head, target, stored: tuple[int, ...], data: dict, log, ckpt: Path) -> _Fit | None:
    """AdamW on the head until --steps or the --minutes budget ends the cosine; a progress bar shows the
    loss. Checkpoints every --checkpoint-minutes into `ckpt`; with --resume it starts from there.
    Returns None when a stop signal ended the run early (the checkpoint holds it)."""
    params = [p for p in head.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    log(f"{args.method} head for {args.target}: {n_params:,} parameters; reads layers {cfg.hidden_layers}")
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    obj = _objective(head, target, stored, data)
    ttt = args.ttt or DEFAULTS[args.method]["ttt"]
    gen = torch.Generator().manual_seed(args.seed)
    weights = sampling_weights(data, args.teacher_share)
    step, ema, done_s, loads, resumed = 0, None, 0.0, [], 0
    if args.resume and ckpt.exists():
        st = torch.load(ckpt, weights_only=False)
        head.load_state_dict(st["head"])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, ema, done_s, loads, resumed = st["step"], st["ema"], st["train_seconds"], st["load_average"], st["resumed"] + 1
        log(f"resumed {ckpt} at step {step} after {done_s / 60:.1f} min of training")
    elif args.resume:
        log(f"--resume: no checkpoint at {ckpt}; starting from the beginning")
    t_start, t_ckpt, progress = time.time(), time.time(), 0.0
    elapsed = lambda: done_s + time.time() - t_start  # noqa: E731
    state = lambda: {"step": step, "ema": ema, "train_seconds": elapsed(), "load_average": loads,  # noqa: E731
                     "resumed": resumed, "method": args.method, "target": args.target}
    bar = tqdm(total=args.steps, initial=step, desc=f"{args.method}", mininterval=5)
    with Stop() as stop:
        while step < args.steps and progress < 1.0 and not stop.asked:
            progress = max(step / args.steps, elapsed() / (args.minutes * 60))
            lr = _lr(args, step, progress)
            for gr in opt.param_groups:
                gr["lr"] = lr
            tokens, hidden, lab = batch(data["train"], gen, args.batch_size, args.seq_len, weights)
            if args.method == "medusa":
                loss, parts = medusa_loss(head, obj, tokens, hidden, lab, stored)
            else:
                loss, parts = eagle_loss(head, obj, tokens, hidden, lab, stored, args.method, ttt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
            bar.set_postfix(loss=f"{ema:.3f}")
            bar.update(1)
            if step % 25 == 0:
                loads.append(round(os.getloadavg()[0], 2))
                log(f"step {step} loss {loss.item():.4f} ema {ema:.4f} lr {lr:.2e} load {loads[-1]} {parts}")
            step += 1
            if time.time() - t_ckpt > args.checkpoint_minutes * 60:
                _checkpoint(ckpt, head, opt, gen, state())
                t_ckpt = time.time()
        bar.close()
        _checkpoint(ckpt, head, opt, gen, state())
        if stop.asked:
            log(f"stopped at step {step} after {elapsed() / 60:.1f} min; checkpoint {ckpt}: "
                f"run the same command with --resume to go on")
            return None
    return _Fit(step, ema, elapsed() / 60, n_params, ttt, obj.scale, loads, resumed)


def _reproduce(args, fit: _Fit, earlier: dict | None, teacher_answers: int | None = None) -> str:
    """The command that repeats this run step for step (after the earlier run's command, if continued).
    It names the teacher answers it read (`teacher_answers`), so that it still holds once the set grows."""
    step, ttt = fit.steps, fit.ttt
    cmd = (f"python -m speclab.train.heads --method {args.method} --target {args.target} --steps {step} "
           f"--minutes 1000 --batch-size {args.batch_size} --seq-len {args.seq_len} --lr {args.lr} --seed {args.seed}"
           + (f" --draft-vocab {args.draft_vocab}" if args.draft_vocab else "") + (f" --ttt {ttt}" if ttt != 1 else "")
           + (f" --medusa-heads {args.medusa_heads}" if args.method == "medusa" else "")
           + (f" --warmup {args.warmup}" if args.warmup != 30 else "")
           + f" --windows {args.windows}" + (f" --heldout-windows {args.heldout_windows}" if args.heldout_windows else "")
           + (f" --hidden-layers {args.hidden_layers}" if args.hidden_layers else "")
           + (f" --teacher-share {args.teacher_share}" if args.teacher_share is not None else "")
           + (f" --teacher-answers {teacher_answers}" if teacher_answers else "")
           + (f" --layer-init {args.layer_init}" if args.layer_init is not None else "")
           + (f" --intermediate-size {args.intermediate_size}" if getattr(args, "intermediate_size", None) else "")
           + (f" --threads {args.threads}" if args.threads else ""))  # threads change the float rounding
    if earlier:  # a continued run: its reproduction is the earlier command, then this one with --init
        cmd = f"{earlier['reproduce']} && {cmd.replace(f'--steps {step} ', f'--steps {step} --init {args.init} ')}"
    return cmd


def _manifest(args, cfg, data: dict, fit: _Fit, fig: dict, earlier: dict | None, t0: float) -> dict:
    """MANIFEST.json's contents: the head, its data and loss, the run(s) that trained it, held-out figures."""
    step, minutes = fit.steps, fit.minutes
    return {
        "about": f"{args.method} head for {args.target}, trained by speclab/train/heads.py on the frozen target's "
                 f"hidden states (float32, CPU)", "method": args.method, "target": cfg.target,
        "hidden_layers": list(cfg.hidden_layers), "parameters": fit.parameters, "draft_vocab_size": args.draft_vocab or None,
        "data": data["about"], "loss": {"eagle": "SmoothL1(g / s, f / s) + 0.1 CE(p, q)", "eagle3": "CE(p, q), training-time test",
                                        "mtp": "CE on the data's token", "medusa": "sum_i CE(p_{t+i}, q_i)"}[args.method],
        "feature_rms": round(fit.feature_rms, 3), "ttt_steps": fit.ttt, "steps": step + (earlier["steps"] if earlier else 0),
        "runs": [{k: r[k] for k in ("steps", "train_minutes", "lr") if k in r} for r in (earlier.get("runs", [earlier]) if earlier else [])]
                + [{"steps": step, "train_minutes": round(minutes, 2), "lr": args.lr}], "batch_size": args.batch_size, "seq_len": args.seq_len, "lr": args.lr,
        "final_loss_ema": round(fit.final_loss_ema, 4), "train_minutes": round(minutes + (earlier["train_minutes"] if earlier else 0), 2),
        "total_minutes": round((time.time() - t0) / 60, 2), "torch_threads": torch.get_num_threads(),
        "machine": f"{os.cpu_count()}-core {cpu_name()}, load average {os.getloadavg()[0]:.1f} at the end", "heldout": fig, "seed": args.seed,
        "teacher_share": args.teacher_share,
        "load_average_during_training": _load_summary(fit.load_average), "resumed": fit.resumed,
        "reproduce": _reproduce(args, fit, earlier, data["about"].get("teacher_answers_used")),
    }


def _load_summary(loads: list[float]) -> dict | None:
    """min / median / max of the 1-minute load average sampled at the log lines."""
    if not loads:
        return None
    return {"min": min(loads), "median": statistics.median(loads), "max": max(loads), "samples": len(loads)}


def run(args) -> dict | None:
    """Train one head as main's flags in `args` ask; save its directory with MANIFEST.json; return the
    manifest (None when a stop signal ended the run: resume it with --resume)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    out, log = _out_and_log(args)
    t0 = time.time()
    target, stored, data = _target_and_data(args, log, t0)
    if data is None:
        log(f"--collect-only: no shard of this data is left for this process to collect ({time.time() - t0:.0f}s)")
        return None
    torch.manual_seed(args.seed)  # the new head's initialisation
    cfg, head, earlier = _new_head(args, target, stored, data, log)
    ckpt = run_dir(out) / "checkpoint.pt"
    fit = _train(args, cfg, head, target, stored, data, log, ckpt)
    if fit is None:  # stopped: the checkpoint holds the run, the head directory is left as it was
        return None
    head.eval()
    save_head(head, out)  # the weights first: an evaluation error must not lose a training run
    fig = evaluate(head, target, data["heldout"], stored, args.method)
    log(f"held-out: {fig}")
    manifest = _manifest(args, cfg, data, fit, fig, earlier, t0)
    save_head(head, out, manifest)
    log(f"saved {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.2f} MB) in {manifest['total_minutes']} min")
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m speclab.train.heads", description=__doc__.splitlines()[0])
    ap.add_argument("--method", choices=["eagle", "eagle3", "mtp", "medusa"], required=True)
    ap.add_argument("--target", default="target", choices=["target", "smollm2"])
    ap.add_argument("--out", default=None, help="head directory (default: speclab/checkpoints/heads/NAME)")
    ap.add_argument("--log", default=None)
    ap.add_argument("--minutes", type=float, default=8.0, help="time budget: the cosine ends with it")
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--windows", type=int, default=800, help="training windows of the embedded corpus")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--ttt", type=int, default=0, help="training-time-test steps (0: the method's default)")
    ap.add_argument("--medusa-heads", type=int, default=4)
    ap.add_argument("--draft-vocab", type=int, default=0, help="draft over the N most frequent tokens (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", default=None, help="continue training this head directory (same method and target)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--checkpoint-minutes", type=float, default=5.0, help="how often the run's state is saved")
    ap.add_argument("--resume", action="store_true",
                    help="go on from the checkpoint of an earlier run of this command (see the module docstring)")
    ap.add_argument("--collect-only", action="store_true",
                    help="only help collect the hidden states, then exit: run it on the other core beside the "
                         "training command (the same data flags), which waits for its shards")
    ap.add_argument("--heldout-windows", type=int, default=0,
                    help="held-out code windows (0: a twelfth of --windows); fixed, the held-out set stays the same as --windows grows")
    ap.add_argument("--teacher-share", type=float, default=None,
                    help="smollm2: the fraction of training sequences drawn from the teacher's answers, the rest "
                         "from code windows (default: uniform over all sequences)")
    ap.add_argument("--teacher-answers", type=int, default=None,
                    help="smollm2: only the first N teacher answers (default: all; the shipped heads read the "
                         "first 1152, the set as it was before it grew)")
    ap.add_argument("--hidden-layers", default=None,
                    help="target layers the head reads, e.g. 8 or 2,4,8 (default: the method's; the fusion ablation)")
    ap.add_argument("--intermediate-size", type=int, default=None,
                    help="eagle/eagle3: the decoder layer's MLP width (default: the target's); with --init, "
                         "the earlier head's MLP is widened to it, computing the same function at the start")
    ap.add_argument("--layer-init", type=int, default=None,
                    help="eagle/eagle3: start the head's decoder layer from this target layer (default: random)")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
