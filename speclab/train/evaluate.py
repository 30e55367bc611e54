"""Figures for the manifest: held-out loss, draft/target agreement, and the cost ratio c.

- held-out loss / perplexity: next-token cross-entropy on fixed windows of held-out modules;
- greedy top-1 agreement: how often argmax q == argmax p along held-out code (teacher-forced),
  which is the acceptance rate of greedy speculative decoding;
- mean Σ_x min(p(x), q(x)) at temperature 1: the expected acceptance rate alpha of speculative
  sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding");
- c = draft decode-step time / target decode-step time at batch 1 with a KV cache (median).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from speclab.timing import median_seconds


def eval_windows(tokens: np.ndarray, n_windows: int, seq_len: int) -> torch.Tensor:
    """(n, T + 1) int64 windows evenly spaced over the held-out stream (deterministic)."""
    n_windows = max(1, min(n_windows, (len(tokens) - 1) // (seq_len + 1)))
    starts = np.linspace(0, len(tokens) - seq_len - 2, n_windows).astype(np.int64)
    return torch.stack([torch.from_numpy(tokens[s:s + seq_len + 1].astype(np.int64)) for s in starts])


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor, batch_size: int = 8) -> dict:
    """Mean next-token cross-entropy (nats) and perplexity over `windows` (n, T + 1)."""
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size]
        logits = model(input_ids=x[:, :-1]).logits                           # (B, T, V)
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    loss = total / count
    return {"heldout_loss": round(loss, 4), "heldout_ppl": round(math.exp(loss), 3)}


@torch.no_grad()
def agreement(target, draft, windows: torch.Tensor, batch_size: int = 8) -> dict:
    """Greedy top-1 agreement and mean Σ min(p, q) (temperature 1) over every position of `windows`."""
    same, overlap, count = 0, 0.0, 0
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size, :-1]
        p = F.softmax(target(input_ids=x).logits, dim=-1)                    # (B, T, V) target
        q = F.softmax(draft(input_ids=x).logits, dim=-1)                     # (B, T, V) draft
        same += (p.argmax(-1) == q.argmax(-1)).sum().item()
        overlap += torch.minimum(p, q).sum(-1).sum().item()
        count += x.numel()
    return {"top1_agreement": round(same / count, 4), "mean_sum_min_pq": round(overlap / count, 4)}


@torch.no_grad()
def decode_step_seconds(model, prefix_len: int = 64, n_steps: int = 100, vocab_limit: int = 1000, seed: int = 0) -> float:
    """Median wall time of one batch-1 decode step (one new token, KV cache of `prefix_len`+ tokens)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(vocab_limit, model.config.vocab_size), (1, prefix_len), generator=gen)
    state = {"out": model(input_ids=ids, use_cache=True)}
    state["tok"] = ids[:, -1:]

    def step():
        out = model(input_ids=state["tok"], cache=state["out"].cache, use_cache=True)
        state["out"], state["tok"] = out, out.logits[:, -1:].argmax(-1)

    return median_seconds(step, repeat=n_steps, warmup=0)


def cost_ratio(target, draft, rounds: int = 3, **kw) -> dict:
    """c = draft / target decode-step time, interleaving the two models `rounds` times (CPU noise)."""
    t_target, t_draft = [], []
    for _ in range(rounds):
        t_target.append(decode_step_seconds(target, **kw))
        t_draft.append(decode_step_seconds(draft, **kw))
    tt, td = float(np.median(t_target)), float(np.median(t_draft))
    return {"target_decode_ms": round(tt * 1e3, 3), "draft_decode_ms": round(td * 1e3, 3), "c": round(td / tt, 3)}
