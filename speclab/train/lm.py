"""Training loops for the embedded pair: next-token cross-entropy, and distillation (DistillSpec).

A target and a draft are `transformers.LlamaForCausalLM` models (RMSNorm, RoPE, SwiGLU, GQA)
trained on random windows of the tokenized corpus with AdamW and a cosine schedule, in float32 on
the CPU. The draft is trained twice: on data alone (`teacher=None`), and by distillation from the
target, minimising the forward KL(p || q) between the target's next-token distribution p (computed
on the fly, no gradient) and the draft's q at every position, as in DistillSpec (Zhou et al. 2023,
"DistillSpec: Improving Speculative Decoding via Knowledge Distillation"). Forward KL rewards the
draft for putting mass wherever the target does, which is what the acceptance Σ min(p, q) rewards.

Checkpoints are written with `save_pretrained` as float16 safetensors.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass
class ModelSpec:
    """Llama dimensions; the vocabulary comes from the tokenizer."""
    hidden_size: int = 320
    num_hidden_layers: int = 8
    num_attention_heads: int = 5
    num_key_value_heads: int = 1
    intermediate_size: int = 864
    max_position_embeddings: int = 512


@dataclass
class TrainSpec:
    """One training run.

    With `budget_minutes` (a shared, noisy CPU), the cosine follows progress = max(step / steps,
    elapsed / budget), and the run ends when progress reaches 1: it always finishes its schedule
    inside the budget. The steps done are recorded; rerunning with that `steps` and no budget
    repeats the run up to the exact shape of the decay.
    """
    steps: int = 300
    batch_size: int = 8
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 100
    budget_minutes: float | None = None  # time box: the schedule ends when the budget does


def llama_config(spec: ModelSpec, vocab_size: int, eos_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, hidden_act="silu",
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
    )


def num_params(model: torch.nn.Module) -> int:
    """Parameters counted once (tied embedding and LM head are one tensor)."""
    return sum(p.numel() for p in model.parameters())


def random_windows(tokens: np.ndarray, batch_size: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """(B, T + 1) int64 windows starting at uniform random offsets of the token stream."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=gen)
    return torch.stack([torch.from_numpy(tokens[s:s + seq_len + 1].astype(np.int64)) for s in starts.tolist()])


def lr_at(step: int, spec: TrainSpec, progress: float | None = None) -> float:
    """Linear warmup, then cosine decay from `lr` to `min_lr_ratio * lr` as progress goes 0 -> 1."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    t = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps) if progress is None else progress
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def loss_fn(model, x: torch.Tensor, teacher=None) -> torch.Tensor:
    """Cross-entropy on the next token, or forward KL(p_teacher || q_model) when a teacher is given."""
    inp, labels = x[:, :-1], x[:, 1:]                                   # (B, T)
    logits = model(input_ids=inp).logits                                # (B, T, V)
    if teacher is None:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
    with torch.no_grad():
        log_p = F.log_softmax(teacher(input_ids=inp).logits, dim=-1)    # (B, T, V) target
    log_q = F.log_softmax(logits, dim=-1)                               # (B, T, V) draft
    return F.kl_div(log_q.reshape(-1, log_q.size(-1)), log_p.reshape(-1, log_p.size(-1)),
                    log_target=True, reduction="batchmean")


def save_checkpoint(model, out_dir: str | Path, tokenizer_dir: str | Path, extra: dict | None = None):
    """`save_pretrained` as float16 safetensors, with the tokenizer files copied beside it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    half = copy.deepcopy(model).to(torch.float16)
    half.save_pretrained(out_dir, safe_serialization=True)
    for f in Path(tokenizer_dir).iterdir():
        shutil.copy(f, out_dir / f.name)
    if extra is not None:
        (out_dir / "training_state.json").write_text(json.dumps(extra, indent=1))


def train(model, tokens: np.ndarray, spec: TrainSpec, out_dir: str | Path, tokenizer_dir: str | Path,
          teacher=None, log=print, desc: str = "train") -> dict:
    """Train `model` in place on random windows of `tokens`; checkpoint every `save_every` steps.

    Returns a dict of figures for the manifest (steps done, tokens seen, final loss, minutes).
    """
    gen = torch.Generator().manual_seed(spec.seed)
    torch.manual_seed(spec.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=spec.lr, betas=(0.9, 0.95))
    model.train()
    if teacher is not None:
        teacher.eval()
    t0, ema, step, losses = time.time(), None, 0, []
    bar = tqdm(total=spec.steps, desc=desc, mininterval=5)
    step, progress, t_decay = 0, 0.0, None
    while step < spec.steps and progress < 1.0:
        if spec.budget_minutes is not None:
            if step == spec.warmup_steps:
                t_decay = time.time()   # the budget left after warmup is the decay's
            if t_decay is not None:
                left = spec.budget_minutes * 60 - (t_decay - t0)
                progress = max((step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps),
                               (time.time() - t_decay) / max(left, 1e-9))
        lr = lr_at(step, spec, progress if spec.budget_minutes is not None else None)
        for g in opt.param_groups:
            g["lr"] = lr
        x = random_windows(tokens, spec.batch_size, spec.seq_len, gen)
        loss = loss_fn(model, x, teacher)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        losses.append(loss.item())
        ema = losses[-1] if ema is None else 0.95 * ema + 0.05 * losses[-1]
        bar.set_postfix(loss=f"{ema:.3f}")
        minutes = (time.time() - t0) / 60
        if step % 10 == 0 or step == spec.steps - 1:
            log(f"{desc} step {step} loss {losses[-1]:.4f} ema {ema:.4f} lr {lr:.2e} "
                f"tok/s {(step + 1) * spec.batch_size * spec.seq_len / (time.time() - t0):.0f}")
        if (step + 1) % spec.save_every == 0:
            model.eval()
            save_checkpoint(model, out_dir, tokenizer_dir, {"step": step + 1, "ema_loss": ema, "minutes": minutes})
            model.train()
        bar.update(1)
        step += 1
    if spec.budget_minutes is not None and step < spec.steps:
        log(f"{desc}: time budget of {spec.budget_minutes} min reached at step {step} of at most {spec.steps}")
    bar.close()
    model.eval()
    save_checkpoint(model, out_dir, tokenizer_dir, {"step": step, "ema_loss": ema})
    steps_done = step
    return {
        "steps": steps_done, "planned_steps": spec.steps, "batch_size": spec.batch_size, "seq_len": spec.seq_len,
        "tokens_seen": steps_done * spec.batch_size * spec.seq_len,
        "final_train_loss": float(np.mean(losses[-20:])), "loss_kind": "cross_entropy" if teacher is None else "forward_kl",
        "train_minutes": round((time.time() - t0) / 60, 2), "seed": spec.seed,
        "train_spec": {**asdict(spec), "steps": steps_done, "budget_minutes": None},
    }


def new_model(spec: ModelSpec, vocab_size: int, eos_id: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(spec, vocab_size, eos_id)).float()
