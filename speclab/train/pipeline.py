"""The whole recipe for the embedded pair: corpus -> tokenizer -> target -> two drafts -> figures.

    python -m speclab.train                    # the committed pair (about 40 minutes on 2 CPU cores)
    python -m speclab.train --preset tiny --out /tmp/pair   # a smoke run in seconds

Stages: collect the stdlib corpus and split it by module; train the byte-level BPE on the train
split; build the held-out prompt sets; train the target; train the draft on data alone and by
distillation from the target (DistillSpec) for the same number of steps; evaluate; ship the draft
with the higher mean Σ min(p, q) as `draft`, the other as `draft-data` or `draft-distilled`, and
write MANIFEST.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from transformers import AutoModelForCausalLM

from speclab.data.corpus import collect, manifest as corpus_manifest
from speclab.data.prompts import build_prompts
from speclab.train.evaluate import agreement, cost_ratio, eval_windows, heldout_loss
from speclab.train.lm import ModelSpec, TrainSpec, new_model, num_params, train
from speclab.train.tokenizer import EOS, save_tokenizer, train_tokenizer


@dataclass
class Preset:
    vocab_size: int
    target: ModelSpec
    draft: ModelSpec
    target_train: TrainSpec
    draft_train: TrainSpec
    max_files: int | None = None     # per split; None = the whole stdlib
    eval_windows: int = 48
    eval_seq_len: int = 512
    decode_steps: int = 100


PRESETS = {
    "full": Preset(
        vocab_size=4096,
        target=ModelSpec(hidden_size=320, num_hidden_layers=8, num_attention_heads=5, num_key_value_heads=1,
                         intermediate_size=864),
        draft=ModelSpec(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=768),
        target_train=TrainSpec(steps=5000, batch_size=4, seq_len=512, lr=2e-3, warmup_steps=40, save_every=100,
                               budget_minutes=21),
        draft_train=TrainSpec(steps=5000, batch_size=4, seq_len=512, lr=3e-3, warmup_steps=40, save_every=100,
                              budget_minutes=14),
    ),
    "tiny": Preset(
        vocab_size=300,
        target=ModelSpec(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=64, max_position_embeddings=64),
        draft=ModelSpec(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                        intermediate_size=32, max_position_embeddings=64),
        target_train=TrainSpec(steps=4, batch_size=2, seq_len=32, warmup_steps=1, save_every=2),
        draft_train=TrainSpec(steps=20, batch_size=2, seq_len=32, warmup_steps=4, save_every=2,
                              budget_minutes=0.02),
        max_files=4, eval_windows=2, eval_seq_len=32, decode_steps=3,
    ),
}


def _tokenize(tok, texts: list[str]) -> np.ndarray:
    """Every text followed by EOS, concatenated: (N,) uint16 token stream."""
    eos = tok.token_to_id(EOS)
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


@dataclass
class _Run:
    """One run's request and places, as `run` was called: what every stage reads."""
    cfg: Preset
    preset: str
    seed: int
    out: Path
    work: Path
    log: Callable[[str], None]
    target_steps: int | None
    draft_steps: int | None
    reuse: tuple[str, ...]
    target_minutes: float | None
    draft_minutes: float | None
    init_target: str | Path | None


@dataclass
class _Data:
    """The corpus, its tokenizer and token streams, and the held-out evaluation windows."""
    cman: dict                 # corpus manifest (corpus.manifest)
    tok_dir: Path
    vocab: int
    eos: int
    train_ids: np.ndarray      # (N_train,) uint16
    held_ids: np.ndarray       # (N_heldout,) uint16
    windows: torch.Tensor      # held-out evaluation windows (evaluate.eval_windows)


def _logger(log_path: Path) -> Callable[[str], None]:
    """A log function: each line time-stamped, to stderr and appended to `log_path`."""
    def log(msg: str):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        with open(log_path, "a") as fh:
            fh.write(line + "\n")
    return log


def _prepare_data(r: _Run, prompts_out: str | Path | None) -> _Data:
    """Collect the corpus, train and save the tokenizer, tokenize both splits, write the prompt sets."""
    files = collect(limit=r.cfg.max_files)
    cman = corpus_manifest(files)
    r.log(f"corpus: {cman['num_files']} files, {cman['num_bytes']} bytes, sha256 {cman['corpus_sha256'][:12]}")
    train_texts = [f.text for f in files if f.split == "train"]
    held_texts = [f.text for f in files if f.split == "heldout"]
    tok = train_tokenizer(train_texts, r.cfg.vocab_size)
    tok_dir = r.work / "tokenizer"
    save_tokenizer(tok, tok_dir, model_max_length=r.cfg.target.max_position_embeddings)
    vocab, eos = tok.get_vocab_size(), tok.token_to_id(EOS)
    train_ids, held_ids = _tokenize(tok, train_texts), _tokenize(tok, held_texts)
    r.log(f"tokenizer: vocab {vocab}; train {len(train_ids)} tokens, held-out {len(held_ids)} tokens")
    if prompts_out is not None:
        _write_prompts(files, tok, cman, prompts_out, r.log)
    windows = eval_windows(held_ids, r.cfg.eval_windows, r.cfg.eval_seq_len)
    return _Data(cman, tok_dir, vocab, eos, train_ids, held_ids, windows)


def _write_prompts(files, tok, cman: dict, path: str | Path, log) -> None:
    """The held-out prompt sets (speclab.data.prompts), with where they come from, as JSON at `path`."""
    sets = build_prompts(files, lambda s: len(tok.encode(s).ids))
    sets = {"about": {"python_version": cman["python_version"], "corpus_sha256": cman["corpus_sha256"],
                      "source": "functions of held-out stdlib modules; see speclab/data/prompts.py"}, **sets}
    Path(path).write_text(json.dumps(sets, indent=1) + "\n")
    log(f"prompts: {', '.join(f'{k} {len(v)}' for k, v in sets.items() if k != 'about')} -> {path}")


def _train_spec(ts: TrainSpec, seed: int, steps: int | None, minutes: float | None) -> TrainSpec:
    """The preset's TrainSpec with this model's seed, and fixed steps or another time budget if given."""
    fixed = {} if steps is None else {"steps": steps, "budget_minutes": None}
    budget = {} if minutes is None or steps is not None else {"budget_minutes": minutes}
    return TrainSpec(**{**asdict(ts), "seed": seed, **fixed, **budget})


def _train_models(r: _Run, data: _Data) -> tuple[dict, dict]:
    """Train (or reuse) the target, the distilled draft, then the data-only draft: (models, figures) by name."""
    models, figures = {}, {}
    # the distilled draft fits its budget first; the data-only draft then gets the same steps,
    # the same initialisation and the same batches, so that the comparison is fair
    jobs = [("target", r.cfg.target, r.cfg.target_train, None),
            ("draft-distilled", r.cfg.draft, r.cfg.draft_train, "target"),
            ("draft-data", r.cfg.draft, r.cfg.draft_train, None)]
    for name, mspec, tspec, teacher in jobs:
        seed = r.seed + (0 if name == "target" else 1)
        steps = r.target_steps if name == "target" else r.draft_steps
        if name == "draft-data":   # same steps as the distilled draft, however long they take
            steps = figures["draft-distilled"]["steps"]
        if name in r.reuse:
            models[name], figures[name] = _reuse_model(r, name)
            continue
        minutes = r.target_minutes if name == "target" else r.draft_minutes
        spec = _train_spec(tspec, seed, steps, minutes)
        models[name], figures[name] = _train_model(r, data, name, mspec, spec, teacher, models.get(teacher))
    return models, figures


def _reuse_model(r: _Run, name: str) -> tuple[torch.nn.Module, dict]:
    """A model trained into WORK by an earlier run, and its figures."""
    model = AutoModelForCausalLM.from_pretrained(r.work / name, dtype=torch.float32).eval()
    figures = json.loads((r.work / name / "figures.json").read_text())
    r.log(f"{name}: reused from {r.work / name}")
    return model, figures


def _train_model(r: _Run, data: _Data, name: str, mspec: ModelSpec, spec: TrainSpec, teacher: str | None,
                 teacher_model) -> tuple[torch.nn.Module, dict]:
    """Initialise one model, train it into WORK/name, measure its held-out loss; write its figures.json."""
    continued = name == "target" and r.init_target is not None
    if continued:
        model = AutoModelForCausalLM.from_pretrained(r.init_target, dtype=torch.float32).train()
        r.log(f"{name}: continuing from {r.init_target}")
    else:
        model = new_model(mspec, data.vocab, data.eos, spec.seed)
    r.log(f"{name}: {num_params(model):,} parameters; {asdict(mspec)}")
    stats = train(model, data.train_ids, spec, r.work / name, data.tok_dir, teacher=teacher_model, log=r.log, desc=name)
    if continued:
        stats["initialized_from"] = str(r.init_target)
    figures = {"parameters": num_params(model), "model": asdict(mspec), **stats, **heldout_loss(model, data.windows)}
    if teacher:
        figures["distilled_from"] = teacher
    (r.work / name / "figures.json").write_text(json.dumps(figures, indent=1))
    r.log(f"{name}: {figures}")
    return model, figures


def _compare_drafts(r: _Run, data: _Data, models: dict, figures: dict) -> None:
    """Add each draft's agreement with the target and its cost ratio c to its figures."""
    for name in ("draft-data", "draft-distilled"):
        figures[name].update(agreement(models["target"], models[name], data.windows))
        figures[name].update(cost_ratio(models["target"], models[name], n_steps=r.cfg.decode_steps))
        r.log(f"{name} vs target: {figures[name]}")


def _ship(r: _Run, data: _Data, figures: dict) -> tuple[str, dict]:
    """Copy the target and the drafts from WORK to OUT (the higher mean Σ min(p, q) as `draft`): (best, dirs)."""
    best = max(("draft-distilled", "draft-data"), key=lambda n: figures[n]["mean_sum_min_pq"])
    other = "draft-data" if best == "draft-distilled" else "draft-distilled"
    dirs = {"target": "target", best: "draft", other: other}
    for name, d in dirs.items():
        if (r.out / d).exists():
            shutil.rmtree(r.out / d)
        shutil.copytree(r.work / name, r.out / d)
        for extra in ("training_state.json", "figures.json"):
            (r.out / d / extra).unlink(missing_ok=True)
    (r.out / "corpus_files.json").write_text(json.dumps(data.cman, indent=1) + "\n")
    return best, dirs


def _manifest(r: _Run, data: _Data, figures: dict, best: str, dirs: dict, t_start: float) -> dict:
    """MANIFEST.json's contents: corpus, tokenizer, evaluation, every model's figures, the reproducing command."""
    cman = data.cman
    return {
        "about": "The embedded model pair of speclab: see speclab/train/pipeline.py. Losses in nats/token.",
        "python_version": cman["python_version"], "corpus_sha256": cman["corpus_sha256"],
        "corpus": {k: cman[k] for k in ("num_files", "num_bytes", "heldout_modules")},
        "corpus_tokens": {"train": int(len(data.train_ids)), "heldout": int(len(data.held_ids))},
        "tokenizer": {"type": "byte-level BPE (tokenizers)", "vocab_size": data.vocab, "eos_token": EOS,
                      "eos_token_id": data.eos},
        "eval": {"heldout_windows": int(len(data.windows)), "seq_len": r.cfg.eval_seq_len,
                 "torch_threads": torch.get_num_threads()},
        "default_draft": best, "directories": dirs,
        "models": {name: {"directory": dirs[name], **figures[name]} for name in figures},
        "preset": r.preset, "seed": r.seed, "total_minutes": round((time.time() - t_start) / 60, 2),
        "reproduce": (f"python -m speclab.train --preset {r.preset} --seed {r.seed} --target-steps "
                      f"{figures['target']['steps']} --draft-steps {figures['draft-distilled']['steps']}"),
    }


def run(preset: str = "full", out: str | Path | None = None, prompts_out: str | Path | None = None,
        work: str | Path | None = None, log_file: str | Path | None = None, seed: int = 0,
        target_steps: int | None = None, draft_steps: int | None = None, reuse: tuple[str, ...] = (),
        threads: int | None = None, target_minutes: float | None = None, draft_minutes: float | None = None,
        init_target: str | Path | None = None) -> dict:
    """Run every stage; write the checkpoints and MANIFEST.json under `out`. Returns the manifest.

    `target_steps` / `draft_steps` replace the presets' time budgets by fixed step counts (to repeat
    a run exactly: the manifest records the steps that the budgets chose). `reuse` names models
    ("target", ...) already trained into `work` by an earlier run (with the same corpus and
    tokenizer), which are loaded instead of trained again. `threads` sets torch's CPU threads.
    `target_minutes` / `draft_minutes` override the presets' time budgets; `init_target` starts the
    target from an earlier checkpoint (same architecture and tokenizer) instead of from scratch.
    """
    cfg = PRESETS[preset]
    if threads is not None:
        torch.set_num_threads(threads)
    out = Path(out) if out is not None else Path(__file__).resolve().parents[1] / "checkpoints"
    work = Path(work) if work is not None else out / "_work"
    work.mkdir(parents=True, exist_ok=True)
    log = _logger(Path(log_file) if log_file else work / "train.log")
    t_start = time.time()
    r = _Run(cfg, preset, seed, out, work, log, target_steps, draft_steps, reuse, target_minutes, draft_minutes,
             init_target)
    data = _prepare_data(r, prompts_out)
    models, figures = _train_models(r, data)
    _compare_drafts(r, data, models, figures)
    best, dirs = _ship(r, data, figures)
    man = _manifest(r, data, figures, best, dirs, t_start)
    (out / "MANIFEST.json").write_text(json.dumps(man, indent=1) + "\n")
    log(f"done in {man['total_minutes']} min; default draft = {best}")
    return man
