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
    log_path = Path(log_file) if log_file else work / "train.log"
    t_start = time.time()

    def log(msg: str):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        with open(log_path, "a") as fh:
            fh.write(line + "\n")

    files = collect(limit=cfg.max_files)
    cman = corpus_manifest(files)
    log(f"corpus: {cman['num_files']} files, {cman['num_bytes']} bytes, sha256 {cman['corpus_sha256'][:12]}")
    train_texts = [f.text for f in files if f.split == "train"]
    held_texts = [f.text for f in files if f.split == "heldout"]

    tok = train_tokenizer(train_texts, cfg.vocab_size)
    tok_dir = work / "tokenizer"
    save_tokenizer(tok, tok_dir, model_max_length=cfg.target.max_position_embeddings)
    vocab, eos = tok.get_vocab_size(), tok.token_to_id(EOS)
    train_ids, held_ids = _tokenize(tok, train_texts), _tokenize(tok, held_texts)
    log(f"tokenizer: vocab {vocab}; train {len(train_ids)} tokens, held-out {len(held_ids)} tokens")
    if prompts_out is not None:
        sets = build_prompts(files, lambda s: len(tok.encode(s).ids))
        sets = {"about": {"python_version": cman["python_version"], "corpus_sha256": cman["corpus_sha256"],
                          "source": "functions of held-out stdlib modules; see speclab/data/prompts.py"}, **sets}
        Path(prompts_out).write_text(json.dumps(sets, indent=1) + "\n")
        log(f"prompts: {', '.join(f'{k} {len(v)}' for k, v in sets.items() if k != 'about')} -> {prompts_out}")
    windows = eval_windows(held_ids, cfg.eval_windows, cfg.eval_seq_len)

    def spec(ts: TrainSpec, s: int, steps: int | None, minutes: float | None) -> TrainSpec:
        fixed = {} if steps is None else {"steps": steps, "budget_minutes": None}
        budget = {} if minutes is None or steps is not None else {"budget_minutes": minutes}
        return TrainSpec(**{**asdict(ts), "seed": s, **fixed, **budget})

    models, figures = {}, {}
    # the distilled draft fits its budget first; the data-only draft then gets the same steps,
    # the same initialisation and the same batches, so that the comparison is fair
    jobs = [("target", cfg.target, cfg.target_train, None),
            ("draft-distilled", cfg.draft, cfg.draft_train, "target"),
            ("draft-data", cfg.draft, cfg.draft_train, None)]
    for name, mspec, tspec, teacher in jobs:
        s = seed + (0 if name == "target" else 1)
        steps = target_steps if name == "target" else draft_steps
        if name == "draft-data":   # same steps as the distilled draft, however long they take
            steps = figures["draft-distilled"]["steps"]
        if name in reuse:
            models[name] = AutoModelForCausalLM.from_pretrained(work / name, dtype=torch.float32).eval()
            figures[name] = json.loads((work / name / "figures.json").read_text())
            log(f"{name}: reused from {work / name}")
            continue
        if name == "target" and init_target is not None:
            model = AutoModelForCausalLM.from_pretrained(init_target, dtype=torch.float32).train()
            log(f"{name}: continuing from {init_target}")
        else:
            model = new_model(mspec, vocab, eos, s)
        log(f"{name}: {num_params(model):,} parameters; {asdict(mspec)}")
        minutes = target_minutes if name == "target" else draft_minutes
        stats = train(model, train_ids, spec(tspec, s, steps, minutes), work / name, tok_dir,
                      teacher=models.get(teacher), log=log, desc=name)
        if name == "target" and init_target is not None:
            stats["initialized_from"] = str(init_target)
        models[name] = model
        figures[name] = {"parameters": num_params(model), "model": asdict(mspec), **stats, **heldout_loss(model, windows)}
        if teacher:
            figures[name]["distilled_from"] = teacher
        (work / name / "figures.json").write_text(json.dumps(figures[name], indent=1))
        log(f"{name}: {figures[name]}")

    for name in ("draft-data", "draft-distilled"):
        figures[name].update(agreement(models["target"], models[name], windows))
        figures[name].update(cost_ratio(models["target"], models[name], n_steps=cfg.decode_steps))
        log(f"{name} vs target: {figures[name]}")

    best = max(("draft-distilled", "draft-data"), key=lambda n: figures[n]["mean_sum_min_pq"])
    other = "draft-data" if best == "draft-distilled" else "draft-distilled"
    dirs = {"target": "target", best: "draft", other: other}
    for name, d in dirs.items():
        if (out / d).exists():
            shutil.rmtree(out / d)
        shutil.copytree(work / name, out / d)
        for extra in ("training_state.json", "figures.json"):
            (out / d / extra).unlink(missing_ok=True)
    (out / "corpus_files.json").write_text(json.dumps(cman, indent=1) + "\n")

    man = {
        "about": "The embedded model pair of speclab: see speclab/train/pipeline.py. Losses in nats/token.",
        "python_version": cman["python_version"], "corpus_sha256": cman["corpus_sha256"],
        "corpus": {k: cman[k] for k in ("num_files", "num_bytes", "heldout_modules")},
        "corpus_tokens": {"train": int(len(train_ids)), "heldout": int(len(held_ids))},
        "tokenizer": {"type": "byte-level BPE (tokenizers)", "vocab_size": vocab, "eos_token": EOS,
                      "eos_token_id": eos},
        "eval": {"heldout_windows": int(len(windows)), "seq_len": cfg.eval_seq_len, "torch_threads": torch.get_num_threads()},
        "default_draft": best, "directories": dirs,
        "models": {name: {"directory": dirs[name], **figures[name]} for name in figures},
        "preset": preset, "seed": seed, "total_minutes": round((time.time() - t_start) / 60, 2),
        "reproduce": (f"python -m speclab.train --preset {preset} --seed {seed} --target-steps "
                      f"{figures['target']['steps']} --draft-steps {figures['draft-distilled']['steps']}"),
    }
    (out / "MANIFEST.json").write_text(json.dumps(man, indent=1) + "\n")
    log(f"done in {man['total_minutes']} min; default draft = {best}")
    return man
