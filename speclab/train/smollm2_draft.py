"""Distil a 4-layer draft of SmolLM2-135M-Instruct (Q4_1-dequantized) from the target, on the CPU.

    python -m speclab.train.smollm2_draft            # train, ship, evaluate (about an hour on 2 cores)
    python -m speclab.train.smollm2_draft --eval-only
    python -m speclab.train.smollm2_draft --init shipped --code-windows 800 --teacher-share 0.6 --lr 5e-4 \
        --threads 1 --budget-minutes 60 --out DIR     # go on training the shipped draft, on more data

Long runs stop and resume: every --checkpoint-minutes (default 5) the draft's layers, the optimiser,
both random generators, the data order and the minutes trained go to $SPECLAB_CACHE/smollm2-draft-train/
runs/NAME/checkpoint.pt; Ctrl-C (or SIGTERM) writes one more and exits, and the same command with
--resume goes on from it (at equal steps, to the same weights; the time budget counts the minutes
already trained). `--precompute-only` computes the soft labels first, on both cores.

The recipe (every choice is recorded in the shipped MANIFEST.json):

1. **Data.** The teacher data (`speclab.train.teacher`): the target's own answers (greedy and T=1) to
   training conversations built from the train-split stdlib modules, disjoint from the held-out
   sets. One conversation in VAL_EVERY (by a hash of its id) is kept for validation.
2. **Soft labels.** One teacher-forced forward of the target over every sequence gives its top-K
   next-token log-probabilities at every position (cached in the cache directory).
3. **Layer-pruned init.** The draft is the target with 4 of its 30 decoder layers: the target's
   embeddings (frozen, tied to the LM head, so the draft never needs its own copy), final norm and
   the layer subset with the lowest validation loss among CANDIDATES (keeping the first and last
   layers matters most: ShortGPT, Men et al. 2024; Sheared-LLaMA).
4. **Distillation.** Minimise the cross-entropy from the target's renormalised top-K distribution
   to the draft's q (forward KL(p || q) up to a constant, as in DistillSpec, Zhou et al. 2023) at
   every response position and a random PROMPT_WEIGHT share of the prompt positions, with AdamW
   and a cosine schedule that fits a time budget (progress = max(step / steps, elapsed / budget)).
5. **Ship.** config.json, the layers and final norm in float16 (layers.safetensors, about 28 MB),
   MANIFEST.json; `speclab.models.smollm2_draft.draft_dir()` materializes the full HF directory.
6. **Evaluate** (`smollm2_draft_eval`): cost ratio c, and acceptance on the held-out sets with the engine.

`--init shipped` replaces step 3 with the shipped draft (the manifest keeps the earlier run's record
as earlier_run); `--code-windows N` adds N windows of the corpus' train split to step 1's data, with
a loss at every position, and `--teacher-share` sets how often the answers are drawn beside them.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from speclab.cpu_info import cpu_name
from speclab.train.resumable import Stop, save_atomic

NUM_LAYERS = 4
CANDIDATES = ((0, 1, 28, 29), (0, 1, 2, 29), (0, 10, 20, 29), (0, 14, 28, 29), (0, 1, 15, 29))
TOP_K = 32                 # target log-probabilities kept per position
PROMPT_WEIGHT = 0.1        # share of prompt positions that get a loss (every response position does)
VAL_EVERY = 6   # one source in VAL_EVERY (by hash) is validation
VAL_DURING = 32  # validation sequences measured during training (early stopping); the final figures use all
COMMAND = "python -m speclab.train.smollm2_draft"
TARGETS_OWN = ("model.embed_tokens", "lm_head")   # the target's tied table: frozen, not checkpointed nor shipped
WINDOW_LEN = 384           # tokens of a code window (plus one), as the SmolLM2 EAGLE head's


def work_dir() -> Path:
    from speclab.models.smollm2 import cache_root
    return cache_root() / "smollm2-draft-train"


def _is_val(seq_id: str) -> bool:
    """By the source (function, passage or question), so two tasks on one function stay on one side."""
    source = seq_id.split("#")[0].split("/", 2)[-1]
    return int(hashlib.sha256(source.encode()).hexdigest(), 16) % VAL_EVERY == 0


def load_target():
    from transformers import AutoModelForCausalLM

    from speclab.models.smollm2 import model_dir
    return AutoModelForCausalLM.from_pretrained(str(model_dir()), dtype=torch.float32).eval()


@torch.no_grad()
def target_topk(target, seqs: list[list[int]], k: int = TOP_K, log=print) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence: (indices int32 (T-1, k), log-probabilities float16 (T-1, k)) of the target's next token."""
    out = []
    for ids in tqdm(seqs, desc="target top-k", mininterval=5):
        logits = target(input_ids=torch.tensor([ids])).logits[0, :-1]
        val, idx = F.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
        out.append((idx.to(torch.int32), val.to(torch.float16)))
    return out


def _key(ids: list[int]) -> str:
    return hashlib.sha1(torch.tensor(ids, dtype=torch.int32).numpy().tobytes()).hexdigest()


def cached_target_topk(target, seqs: list[list[int]], k: int = TOP_K, log=print) -> list:
    """target_topk with a per-sequence cache in work_dir() (a grown teacher set reuses earlier work)."""
    path = work_dir() / f"topk-cache-k{k}.pt"
    cache = torch.load(path, weights_only=True) if path.is_file() else {}
    todo = [ids for ids in seqs if _key(ids) not in cache]
    log(f"target top-{k}: {len(seqs) - len(todo)} sequences cached, {len(todo)} to compute")
    for i in range(0, len(todo), 8):                   # saved every 8 sequences: an interrupted run keeps its work
        t0 = time.perf_counter()
        for ids, tk in zip(todo[i:i + 8], target_topk(target, todo[i:i + 8], k)):
            cache[_key(ids)] = tk
        cache["__seconds__"] = cache.get("__seconds__", 0.0) + time.perf_counter() - t0    # across runs
        torch.save(cache, path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)
    log(f"target top-{k}: {cache.get('__seconds__', 0.0):.0f} s of target forwards in all (this run and earlier ones)")
    return [cache[_key(ids)] for ids in seqs], round(cache.get("__seconds__", 0.0), 1)


def precompute(code_windows: int = 0, log=print, teacher_answers: int | None = None) -> None:
    """Only the target's top-K over the current teacher data (its first `teacher_answers`, or all) and
    `code_windows` code windows (to overlap with teacher generation, or to use both cores before a
    one-thread training run)."""
    work_dir().mkdir(parents=True, exist_ok=True)
    _prepare_data(teacher_answers, log, code_windows)


def new_draft(target, layers: tuple[int, ...]):
    """A transformers Llama with the target's embeddings (frozen, tied), final norm and `layers`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**target.config.to_dict(), "num_hidden_layers": len(layers), "tie_word_embeddings": True})
    cfg.dtype = torch.float32
    draft = LlamaForCausalLM(cfg)
    sd = {"model.embed_tokens.weight": target.model.embed_tokens.weight, "model.norm.weight": target.model.norm.weight}
    for j, i in enumerate(layers):
        for name, t in target.model.layers[i].state_dict().items():
            sd[f"model.layers.{j}.{name}"] = t
    draft.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    draft.tie_weights()
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft


def positions(prompt_len: int, n: int, gen: torch.Generator | None) -> torch.Tensor:
    """Rows (of the n = len(ids) - 1 next-token positions) that get a loss: every response position,
    and with `gen` a random PROMPT_WEIGHT share of the prompt positions (the LM head, 49152 x 576,
    is most of the draft's cost, so sampling prompt positions beats weighting all of them)."""
    resp = torch.arange(prompt_len - 1, n)
    if gen is None:
        return resp
    prompt = torch.nonzero(torch.rand(prompt_len - 1, generator=gen) < PROMPT_WEIGHT).flatten()
    return torch.cat([prompt, resp])


def seq_loss(draft, ids: list[int], prompt_len: int, topk, gen: torch.Generator | None = None):
    """(loss summed over the chosen positions, their number, greedy agreement of the response positions)."""
    idx, val = topk
    rows = positions(prompt_len, len(ids) - 1, gen)
    hidden = draft.model(input_ids=torch.tensor([ids[:-1]])).last_hidden_state[0, rows]
    lq = F.log_softmax(draft.lm_head(hidden).float(), dim=-1)
    idx, val = idx[rows].long(), val[rows].float()
    p = F.softmax(val, dim=-1)                                           # the target's top-K, renormalised
    loss = -(p * lq.gather(-1, idx)).sum()
    n_resp = len(ids) - prompt_len
    agree = lq[-n_resp:].argmax(-1) == idx[-n_resp:, 0] if n_resp else torch.zeros(0, dtype=torch.bool)
    return loss, len(rows), agree


@torch.no_grad()
def evaluate(draft, data: list) -> dict:
    """Validation on response positions: soft cross-entropy to the target's top-K, greedy top-1 agreement."""
    total, count, agree, n = 0.0, 0, 0, 0
    for ids, plen, tk in data:
        loss, c, a = seq_loss(draft, ids, plen, tk)
        total, count, agree, n = total + loss.item(), count + c, agree + int(a.sum()), n + a.numel()
    return {"val_loss": round(total / max(count, 1), 4), "val_top1_agreement": round(agree / max(n, 1), 4)}


def lr_at(progress: float, lr: float, warmup: float, min_ratio: float = 0.1) -> float:
    if progress < warmup:
        return lr * progress / warmup
    t = (progress - warmup) / max(1e-9, 1 - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


@dataclass
class _Loop:
    """The distillation loop's state between steps: what a checkpoint holds, so that a resumed run goes on
    exactly where it stopped (the same draws, the same schedule; at equal steps, the same weights)."""
    step: int = 0
    positions: int = 0
    seconds: float = 0.0              # trained so far, across runs: the time budget counts it
    history: list = None
    best: dict = None
    best_state: dict = None
    order: list = None
    resumed: int = 0


def _own(sd: dict) -> dict:
    """The draft's own tensors (its embeddings are the target's, frozen): what checkpoints and ships."""
    return {k: v.detach().clone() for k, v in sd.items() if not k.startswith(TARGETS_OWN)}


def _draw(data: list, loop: _Loop, rng: random.Random, weights: list[float] | None) -> int:
    """The next training row: a shuffled pass over the data, or with `weights` drawn in proportion."""
    if weights is not None:
        return rng.choices(range(len(data)), weights)[0]
    if not loop.order:
        loop.order = list(range(len(data)))
        rng.shuffle(loop.order)
    return loop.order.pop()


def _step(draft, data: list, loop: _Loop, rng, gen, weights, tokens_per_step: int) -> float:
    """One step's gradients (the optimiser steps outside): rows until tokens_per_step; returns its loss."""
    parts, n_tok = [], 0
    while n_tok < tokens_per_step:
        parts.append(data[_draw(data, loop, rng, weights)])
        n_tok += len(parts[-1][0])
    weight = sum(PROMPT_WEIGHT * (pl - 1) + (len(ids) - pl) for ids, pl, _ in parts)   # expected positions
    total = 0.0
    for ids, pl, tk in parts:
        loss, _, _ = seq_loss(draft, ids, pl, tk, gen)
        (loss / weight).backward()
        total += loss.item()
    loop.positions += n_tok
    return total / weight


def train(draft, data: list, val: list, *, steps: int, budget_minutes: float, tokens_per_step: int, lr: float,
          seed: int, log, eval_every: int = 20, weights: list[float] | None = None, ckpt: Path | None = None,
          checkpoint_minutes: float = 5.0, resume: bool = False, should_stop: Callable[[], bool] | None = None,
          warmup: float = 0.05) -> dict | None:
    """AdamW on the draft's layers and norm; returns the run's figures, or None when `should_stop` ended it
    early (the checkpoint `ckpt` then holds the run: the same call with resume=True goes on from it).

    The teacher data is small (a 2-core machine generates a few thousand tokens in ten minutes), so
    the run passes over it many times: every `eval_every` steps the validation loss is measured and
    the draft ends with the weights of its best validation (early stopping), measured on the first
    VAL_DURING validation sequences (all of them would cost as much as the steps between). Every
    `checkpoint_minutes` the draft, the optimiser, both random generators and the loop's state go to `ckpt`.
    """
    val = val[:VAL_DURING]
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng, gen, loop = random.Random(seed), torch.Generator().manual_seed(seed), _Loop(history=[], order=[])
    if resume and ckpt is not None and ckpt.is_file():
        st = torch.load(ckpt, weights_only=False)
        draft.load_state_dict(st["draft"], strict=False)
        opt.load_state_dict(st["opt"])
        rng.setstate(st["rng"])
        gen.set_state(st["gen"])
        loop = st["loop"]
        loop.resumed += 1
        log(f"resumed {ckpt} at step {loop.step} after {loop.seconds / 60:.1f} min of training")
    else:
        if resume:
            log(f"--resume: no checkpoint at {ckpt}; starting from the beginning")
        loop.best, loop.best_state = {"step": 0, **evaluate(draft, val)}, _own(draft.state_dict())
        log(f"validation {loop.best}")
    save = lambda: ckpt is not None and save_atomic(ckpt, {  # noqa: E731
        "draft": _own(draft.state_dict()), "opt": opt.state_dict(), "rng": rng.getstate(), "gen": gen.get_state(),
        "loop": loop, "settings": {"steps": steps, "lr": lr, "tokens_per_step": tokens_per_step, "seed": seed}})
    t0, t_ckpt, base = time.perf_counter(), time.perf_counter(), loop.seconds
    progress = lambda: max(loop.step / steps, loop.seconds / (60 * budget_minutes))  # noqa: E731
    bar = tqdm(total=steps, initial=loop.step, desc="distil", mininterval=5)
    draft.train()
    while progress() < 1:
        if should_stop is not None and should_stop():
            loop.seconds = base + time.perf_counter() - t0
            save()
            log(f"stopped at step {loop.step} after {loop.seconds / 60:.1f} min; checkpoint {ckpt}: "
                f"run the same command with --resume to go on")
            return None
        opt.zero_grad(set_to_none=True)
        loss = _step(draft, data, loop, rng, gen, weights, tokens_per_step)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(progress(), lr, warmup=warmup)
        opt.step()
        loop.step, loop.seconds = loop.step + 1, base + time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}")
        if loop.step % 10 == 0 or progress() >= 1:
            log(f"step {loop.step} loss {loss:.4f} lr {opt.param_groups[0]['lr']:.2e} positions {loop.positions} "
                f"{loop.seconds:.0f} s load {os.getloadavg()[0]:.2f}")
        if loop.step % eval_every == 0 or progress() >= 1:
            draft.eval()
            loop.history.append({"step": loop.step, **evaluate(draft, val)})
            draft.train()
            log(f"validation {loop.history[-1]}")
            if loop.history[-1]["val_loss"] < loop.best["val_loss"]:
                loop.best, loop.best_state = loop.history[-1], _own(draft.state_dict())
        if time.perf_counter() - t_ckpt > 60 * checkpoint_minutes:
            save()
            t_ckpt = time.perf_counter()
    bar.close()
    save()
    draft.load_state_dict(loop.best_state, strict=False)
    draft.eval()
    log(f"kept the weights of step {loop.best['step']}: {loop.best}")
    return {"steps": loop.step, "positions_seen": loop.positions, "seconds": round(loop.seconds, 1),
            "val_history": loop.history, "kept_step": loop.best["step"], "eval_every": eval_every,
            "val_sequences_during_training": len(val), "resumed": loop.resumed}


def save_shipped(draft, out: Path, manifest: dict) -> None:
    """config.json, layers.safetensors (float16, no embeddings), MANIFEST.json."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.to(torch.float16).contiguous() for k, v in _own(draft.state_dict()).items()}
    save_file(sd, str(out / "layers.safetensors"), metadata={"format": "pt"})
    cfg = draft.config.to_dict()
    cfg["dtype"] = "float32"
    cfg.pop("torch_dtype", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    _keep_ranking(out, manifest)
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")


def _keep_ranking(out: Path, manifest: dict) -> None:
    """The token ranking (`draft_vocab_size`) ranks the target's vocabulary, not the draft's: a new draft keeps
    the shipped one and its manifest record (copied when `out` is another directory)."""
    import shutil

    from speclab.models.draft_vocab import RANKING_FILE
    from speclab.models.smollm2_draft import SHIPPED
    src = out if (out / "MANIFEST.json").is_file() and (out / RANKING_FILE).is_file() else SHIPPED
    if not (src / RANKING_FILE).is_file() or not (src / "MANIFEST.json").is_file():
        return
    record = json.loads((src / "MANIFEST.json").read_text()).get("token_ranking")
    if record is not None:
        manifest["token_ranking"] = record
    if src != out:
        shutil.copyfile(src / RANKING_FILE, out / RANKING_FILE)


@dataclass
class _Settings:
    """run's arguments that the recipe and the manifest read."""
    budget_minutes: float
    steps: int
    tokens_per_step: int
    lr: float
    seed: int
    layers: tuple[int, ...] | None      # given by --layers, else chosen among CANDIDATES
    init: str = "layers"                # "layers": a layer-pruned target; "shipped": go on from the shipped draft
    code_windows: int = 0               # training windows of the stdlib corpus' train split, beside the answers
    teacher_share: float | None = None  # the answers' share of the rows drawn (None: uniform over all rows)
    warmup: float = 0.05
    resume: bool = False
    checkpoint_minutes: float = 5.0


@dataclass
class _Data:
    """The teacher data used, its manifest, the train/validation rows (ids, prompt_len, top-K) and their cost."""
    teacher: dict
    tman: dict
    train: list
    val: list
    windows: int                        # how many of `train` (its last rows) are code windows
    topk_seconds: float                 # the target's top-K in this run
    topk_all_seconds: float             # ... in this run and the earlier ones (cached)


@dataclass
class _Init:
    """The layer-pruned initialisation: the candidates' figures, the chosen one, the seconds it took."""
    candidates: list[dict]
    best: dict
    seconds: float


_WHY = ("The tied 49152x576 embedding table is 113 MB in float32, above the 40 MB cap: the draft keeps the "
        "target's table frozen and ships only its own layers, which draft_dir() completes into a normal HF "
        "directory. 4 layers in float16 fit the cap (about 28 MB); the LM head (21% of a target forward) "
        "dominates the draft's cost, so more layers change c little while raising acceptance; layer-pruned "
        "init from the target converges far faster on a CPU than training from scratch.")


def _logger(path: Path) -> Callable[[str], None]:
    """A log function: each line time-stamped (UTC), to stderr and appended to `path`."""
    logf = open(path, "a")

    def log(msg: str):
        line = f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}"
        print(line, file=sys.stderr, flush=True)
        logf.write(line + "\n")
        logf.flush()
    return log


def _prepare_data(teacher_answers: int | None, log, code_windows: int = 0):
    """Steps 1-2: the target, the teacher data with its top-K soft labels, split by source, and
    `code_windows` windows of the corpus' train split (every position trained on): (target, _Data)."""
    from speclab.data.corpus import token_windows
    from speclab.models.smollm2 import model_dir
    from speclab.train.teacher import load_teacher_data, teacher_manifest

    teacher = load_teacher_data()
    tman = teacher_manifest()
    if teacher_answers is not None:              # the first answers of the teacher data (its order is fixed)
        teacher = {k: v[:teacher_answers] for k, v in teacher.items()}
    target = load_target()
    t1 = time.perf_counter()
    windows = token_windows(model_dir(), code_windows, 0, WINDOW_LEN)["train"] if code_windows else []
    seqs = [list(ids) for ids in teacher["token_ids"]] + windows
    topk, topk_all_seconds = cached_target_topk(target, seqs, log=log)
    topk_seconds = round(time.perf_counter() - t1, 1)
    log(f"target top-{TOP_K} over {len(topk)} sequences: {topk_seconds} s")
    rows = list(zip(seqs, list(teacher["prompt_lens"]) + [1] * len(windows), topk))
    is_val = [_is_val(i) for i in teacher["ids"]] + [False] * len(windows)
    data = [r for r, v in zip(rows, is_val) if not v]
    val = [r for r, v in zip(rows, is_val) if v]
    log(f"{len(data)} training sequences ({sum(len(r[0]) for r in data)} tokens; {len(windows)} of them code "
        f"windows), {len(val)} validation")
    return target, _Data(teacher, tman, data, val, len(windows), topk_seconds, topk_all_seconds)


def row_weights(d: _Data, teacher_share: float | None) -> list[float] | None:
    """Per training row, its chance to be drawn: the answers `teacher_share` of the draws, the code windows
    the rest (None: every row as often, a shuffled pass over them)."""
    if teacher_share is None or not d.windows:
        return None
    if not 0 < teacher_share < 1:
        raise ValueError(f"--teacher-share {teacher_share}: a fraction strictly between 0 and 1")
    n_t = len(d.train) - d.windows
    return [teacher_share / n_t] * n_t + [(1 - teacher_share) / d.windows] * d.windows


def load_shipped_layers(draft, shipped: Path) -> None:
    """Put the shipped draft's layers and final norm (float16 on disk) into `draft`, to go on training it."""
    from safetensors.torch import load_file

    sd = {k: v.float() for k, v in load_file(str(Path(shipped) / "layers.safetensors")).items()}
    missing, unexpected = draft.load_state_dict(sd, strict=False)
    own = [k for k in missing if not k.startswith(TARGETS_OWN)]
    if own or unexpected:
        raise ValueError(f"{shipped} does not fit a {NUM_LAYERS}-layer draft: missing {own}, unexpected {unexpected}")


def _layer_init(target, val: list, layers: tuple[int, ...] | None, log) -> _Init:
    """Step 3: the layer subset to start from: the best of CANDIDATES on validation, or the given `layers`."""
    t1 = time.perf_counter()
    init_file = work_dir() / "init_candidates.json"
    if layers is None:
        init = []
        for cand in CANDIDATES:
            init.append({"layers": list(cand), **evaluate(new_draft(target, cand), val)})
            log(f"init {init[-1]}")
        init_file.write_text(json.dumps(init, indent=1) + "\n")
        best = min(init, key=lambda r: r["val_loss"])
    else:                                      # chosen earlier: the candidates' figures come from that run
        init = json.loads(init_file.read_text()) if init_file.is_file() else []
        best = {"layers": list(layers), **evaluate(new_draft(target, tuple(layers)), val)}
        log(f"init (given) {best}")
    return _Init(init, best, round(time.perf_counter() - t1, 1))


def _architecture(draft) -> dict:
    """The manifest's architecture: the shipped draft's shape and what it ships."""
    return {"type": "LlamaForCausalLM", "num_hidden_layers": NUM_LAYERS, "hidden_size": 576,
            "vocab_size": 49152, "tie_word_embeddings": True,
            "embeddings": "the target's, frozen during training and not shipped: draft_dir() adds them",
            "num_parameters_shipped": sum(v.numel() for k, v in draft.state_dict().items()
                                          if not k.startswith(TARGETS_OWN)),
            "shipped_dtype": "float16 (materialized in float32)"}


def _data_figures(d: _Data) -> dict:
    """The manifest's data: the teacher set and how much of it trained and validated."""
    tman, teacher = d.tman, d.teacher
    return {"teacher": {k: tman[k] for k in ("name", "prompts", "counts", "tokens", "created", "command")},
            "teacher_answers_used": len(teacher["ids"]),
            "teacher_answers_used_greedy": sum(t == 0 for t in teacher["temperature"]),
            "train_sequences": len(d.train), "val_sequences": len(d.val),
            "train_tokens": sum(len(r[0]) for r in d.train),
            "code_windows": {"train": d.windows, "tokens_each": WINDOW_LEN + 1,
                             "source": "stdlib corpus, train split (speclab.data.corpus.token_windows, seed 0)",
                             "loss": "every position (a window has no prompt)"} if d.windows else None,
            "val_split": f"source (function, passage, question) hash % {VAL_EVERY} == 0"}


def _training_figures(s: _Settings, d: _Data, init: _Init, fig: dict, final: dict, total: float) -> dict:
    """The manifest's training: loss, optimiser and schedule, the loop's figures, timings and machine."""
    return {"loss": f"cross-entropy from the target's renormalised top-{TOP_K} next-token distribution "
                    f"(forward KL up to a constant, DistillSpec) at every response position and a random "
                    f"{PROMPT_WEIGHT} share of prompt positions; validation on response positions",
            "optimizer": "AdamW(betas 0.9/0.95, wd 0), grad clip 1.0", "lr": s.lr,
            "schedule": f"linear warmup {s.warmup:.0%}, cosine to 10%, progress = max(step/steps, elapsed/budget)",
            "teacher_share": s.teacher_share, "checkpoint_minutes": s.checkpoint_minutes,
            "early_stopping": "the weights of the best validation loss are kept (kept_step)",
            "max_steps": s.steps, "budget_minutes": s.budget_minutes, "tokens_per_step": s.tokens_per_step,
            "seed": s.seed, "trainable": "decoder layers and final norm", **fig,
            "target_topk_seconds_this_run": d.topk_seconds,
            "target_topk_seconds_all_runs": d.topk_all_seconds, "final_validation": final,
            "initial_validation": {k: init.best[k] for k in ("val_loss", "val_top1_agreement")},
            "total_seconds": total,
            "total_seconds_with_earlier_topk": round(total - d.topk_seconds + d.topk_all_seconds, 1),
            "torch_threads": torch.get_num_threads(),
            "machine": _machine()}


def _manifest(draft, s: _Settings, d: _Data, init: _Init, fig: dict, final: dict, total: float) -> dict:
    """Step 5's MANIFEST.json: architecture, why, init, data, training and the commands that reproduce it."""
    tman = d.tman
    return {
        "model": "speclab SmolLM2 draft: 4 decoder layers distilled from SmolLM2-135M-Instruct (Q4_1-dequantized)",
        "architecture": _architecture(draft),
        "why": _WHY,
        "init": {"candidates": init.candidates, "chosen_layers": init.best["layers"], "seconds": init.seconds,
                 "selection": "lowest validation loss among the candidates" if s.layers is None else
                              "given by --layers (the candidates' figures are from the run that chose it)"}
                if s.init == "layers" else {"continued": "from the shipped draft (--init shipped); its own run's "
                                                         "init is in earlier_run"},
        "data": _data_figures(d),
        "training": _training_figures(s, d, init, fig, final, total),
        "reproduce": [f"{c}  (the teacher set's runs, in order)" for c in tman.get("commands", [tman["command"]])]
                     + [" ".join([COMMAND, *sys.argv[1:]]) if sys.argv[1:] else COMMAND],
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _start(s: _Settings, target, d: _Data, log):
    """The draft to train and its _Init: layer-pruned from the target (step 3), or the shipped draft."""
    from speclab.models.smollm2_draft import SHIPPED
    if s.init == "shipped":
        draft = new_draft(target, CANDIDATES[0])       # any 4 of the target's layers: the shipped ones replace them
        load_shipped_layers(draft, SHIPPED)
        best = {"layers": None, **evaluate(draft, d.val)}
        log(f"init: the shipped draft {best}")
        return draft, _Init([], best, 0.0)
    init = _layer_init(target, d.val, s.layers, log)
    return new_draft(target, tuple(init.best["layers"])), init


def _earlier(s: _Settings) -> dict | None:
    """What the shipped draft's manifest says of how it was made and how well it drafted, when this run goes on
    from it (kept in the new manifest as earlier_run, nested when that draft was itself continued)."""
    if s.init != "shipped":
        return None
    from speclab.models.smollm2_draft import shipped_manifest
    m = shipped_manifest()
    return {k: m[k] for k in ("init", "data", "training", "reproduce", "created", "cost_ratio", "acceptance",
                              "verdict", "earlier_run") if k in m}


def run(budget_minutes: float = 35.0, steps: int = 400, tokens_per_step: int = 512, lr: float = 1e-3,
        seed: int = 0, out: Path | None = None, evaluate_after: bool = True, teacher_answers: int | None = None,
        layers: tuple[int, ...] | None = None, **more) -> Path | None:
    """The recipe of the module docstring: data, soft labels, init, distillation, ship, evaluate. `more`: the
    other _Settings (init, code_windows, teacher_share, warmup, resume, checkpoint_minutes). None when a
    stop signal ended the run (the same command with --resume goes on)."""
    from speclab.models.smollm2_draft import SHIPPED

    s = _Settings(budget_minutes, steps, tokens_per_step, lr, seed, layers, **more)
    out = Path(out) if out is not None else SHIPPED
    work_dir().mkdir(parents=True, exist_ok=True)
    log = _logger(work_dir() / "train.log")
    torch.manual_seed(seed)
    t_start = time.perf_counter()
    log(f"start: {' '.join([COMMAND, *sys.argv[1:]])}, budget {budget_minutes} min, "
        f"torch threads {torch.get_num_threads()}")
    target, d = _prepare_data(teacher_answers, log, s.code_windows)
    draft, init = _start(s, target, d, log)
    earlier = _earlier(s)
    del target
    with Stop() as stop:
        fig = train(draft, d.train, d.val, steps=steps, budget_minutes=budget_minutes,
                    tokens_per_step=tokens_per_step, lr=lr, seed=seed, log=log,
                    weights=row_weights(d, s.teacher_share), ckpt=work_dir() / "runs" / out.name / "checkpoint.pt",
                    checkpoint_minutes=s.checkpoint_minutes, resume=s.resume, should_stop=lambda: stop.asked,
                    warmup=s.warmup)
    if fig is None:
        return None
    final = evaluate(draft, d.val)
    log(f"final validation {final}")
    total = round(time.perf_counter() - t_start, 1)
    manifest = _manifest(draft, s, d, init, fig, final, total)
    if earlier is not None:
        manifest["earlier_run"] = earlier
    save_shipped(draft, out, manifest)
    log(f"shipped {out}: {sum(p.stat().st_size for p in out.iterdir()) / 1e6:.1f} MB; total {total} s")
    if evaluate_after:
        from speclab.train.smollm2_draft_eval import evaluate_shipped
        evaluate_shipped(out, log=log)
    return out


def _machine() -> dict:
    return {"processor": cpu_name(), "cpus": os.cpu_count(),
            "load_average_1min_at_the_end": round(os.getloadavg()[0], 2)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-minutes", type=float, default=35.0, help="time box of the distillation loop")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--tokens-per-step", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="default: speclab/checkpoints/smollm2-draft")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--teacher-answers", type=int, default=None, help="use only the first N teacher answers")
    p.add_argument("--layers", default=None, help="the target layers to start from, e.g. 0,14,28,29 (default: "
                                                  "the best of CANDIDATES on validation)")
    p.add_argument("--eval-only", action="store_true", help="evaluate the shipped draft and update its manifest")
    p.add_argument("--eval-t1", action="store_true", help="also measure T=1 acceptance")
    p.add_argument("--eval-max-tokens", type=int, default=None, help="default: smollm2_draft_eval.MAX_TOKENS")
    p.add_argument("--eval-prompts", type=int, default=None, help="per held-out set; default: NUM_PROMPTS")
    p.add_argument("--precompute-only", action="store_true", help="only cache the target's top-K for the teacher data (and --code-windows)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--init", choices=("layers", "shipped"), default="layers",
                   help="layers: start from a layer-pruned target (default); shipped: go on training the shipped draft")
    p.add_argument("--code-windows", type=int, default=0,
                   help=f"also train on N windows of {WINDOW_LEN + 1} tokens of the corpus' train split")
    p.add_argument("--teacher-share", type=float, default=None,
                   help="with --code-windows: the answers' share of the rows drawn (default: uniform over all rows)")
    p.add_argument("--warmup", type=float, default=0.05, help="share of the run spent warming up the learning rate")
    p.add_argument("--checkpoint-minutes", type=float, default=5.0, help="how often the run's state is saved")
    p.add_argument("--resume", action="store_true",
                   help="go on from the checkpoint of an earlier run of this command (Ctrl-C writes one)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.precompute_only:
        precompute(a.code_windows, teacher_answers=a.teacher_answers)
        return
    if a.eval_only:
        from speclab.models.smollm2_draft import SHIPPED
        from speclab.train.smollm2_draft_eval import evaluate_shipped
        from speclab.train import smollm2_draft_eval as E
        evaluate_shipped(Path(a.out) if a.out else SHIPPED, t1=a.eval_t1, max_tokens=a.eval_max_tokens or E.MAX_TOKENS,
                         num_prompts=a.eval_prompts or E.NUM_PROMPTS)
        return
    run(a.budget_minutes, a.steps, a.tokens_per_step, a.lr, a.seed, a.out, evaluate_after=not a.no_eval,
        teacher_answers=a.teacher_answers, layers=tuple(map(int, a.layers.split(","))) if a.layers else None,
        init=a.init, code_windows=a.code_windows, teacher_share=a.teacher_share, warmup=a.warmup, resume=a.resume,
        checkpoint_minutes=a.checkpoint_minutes)


if __name__ == "__main__":
    main()
