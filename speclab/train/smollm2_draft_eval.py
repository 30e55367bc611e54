"""Figures for the SmolLM2 draft's manifest: cost ratio c and acceptance on the held-out chat sets.

- c = draft forward time / target forward time at batch 1 (speclab's paged-KV forward, one new
  token after 128 cached ones, logits included; medians, the two models interleaved three times);
- per held-out set (edit, codegen, qa, chat; chat_prompts.json): the engine's acceptance rate and
  mean acceptance length (1 + accepted / drafts) for k drafts, greedy, and whether greedy draft
  speculation reproduced plain greedy decoding token for token (float32, the same batch);
  optionally T=1 (seeded) acceptance. Tokens/s of plain and speculative runs come from one run on
  a shared 2-core CPU: ratios, not a benchmark (speclab.bench is that).

    python -m speclab.train.smollm2_draft --eval-only [--eval-t1]
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from speclab.timing import timed
from speclab.metrics import spec_decode_counters

MAX_TOKENS = 48          # short answers: the 2-core machine is shared, and acceptance settles early
NUM_PROMPTS = 6          # of each held-out set's 12 (the first ones, as committed)
K = 2  # drafts per step: the best k for this draft on this CPU (`python -m speclab.bench heads --k 2` vs 4)


def cost_ratio(target, draft, rounds: int = 3) -> dict:
    """c at batch 1 with speclab's forward (see the module docstring)."""
    from speclab.timing import forward_seconds

    tt, td = [], []
    for _ in range(rounds):
        tt.append(forward_seconds(target, context=128, tokens=1, repeat=15))
        td.append(forward_seconds(draft, context=128, tokens=1, repeat=15))
    t, d = statistics.median(tt), statistics.median(td)
    return {"target_forward_ms": round(t * 1e3, 2), "draft_forward_ms": round(d * 1e3, 2), "c": round(d / t, 3),
            "how": "speclab.timing.forward_seconds(context=128, tokens=1), batch 1, float32, "
                   "medians of 3 interleaved rounds"}


def _delta(after: dict, before: dict) -> dict:
    drafts = after["num_drafts"] - before["num_drafts"]
    dtok = after["num_draft_tokens"] - before["num_draft_tokens"]
    acc = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    return {"num_drafts": drafts, "num_draft_tokens": dtok, "num_accepted_tokens": acc,
            "acceptance_rate": round(acc / dtok, 4) if dtok else None,
            "mean_acceptance_length": round(1 + acc / drafts, 3) if drafts else None}


def acceptance(draft_path: Path, t1: bool = False, max_tokens: int = MAX_TOKENS, k: int = K,
               num_prompts: int = NUM_PROMPTS, log=print) -> dict:
    """Per held-out set: plain vs draft speculation with the engine (see the module docstring)."""
    from speclab.data.chat_prompts import SETS, chat_prompts_version, load_chat_prompts
    from speclab.llm import LLM
    from speclab.sampling_params import SamplingParams

    plain = LLM(model="smollm2", max_num_seqs=16)
    spec = LLM(model="smollm2", max_num_seqs=16, speculative_config={
        "method": "draft_model", "model": str(draft_path), "num_speculative_tokens": k})
    out = {"prompt_set_version": chat_prompts_version(), "k": k, "max_tokens": max_tokens, "dtype": "float32",
           "num_prompts": num_prompts,
           "batch": f"each set's first {num_prompts} conversations in one ragged batch (max_num_seqs 16)", "sets": {}}
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
    warm = load_chat_prompts("chat")[-1:]                 # untimed: first calls pay one-off costs
    plain.chat(warm, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    spec.chat(warm, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    for kind in SETS:
        convs = load_chat_prompts(kind)[:num_prompts]
        a, t_plain = timed(lambda: plain.chat(convs, greedy, use_tqdm=False))
        before = spec_decode_counters(spec.get_metrics())
        b, t_spec = timed(lambda: spec.chat(convs, greedy, use_tqdm=False))
        row = _delta(spec_decode_counters(spec.get_metrics()), before)
        n_tok = sum(len(o.outputs[0].token_ids) for o in a)
        same = all(x.outputs[0].token_ids == y.outputs[0].token_ids for x, y in zip(a, b))
        row.update({"greedy_equal_to_plain": same,
                    "generated_tokens": n_tok, "plain_tok_s": round(n_tok / t_plain, 1),
                    "spec_tok_s": round(sum(len(o.outputs[0].token_ids) for o in b) / t_spec, 1),
                    "wall_ratio_plain_over_spec": round(t_plain / t_spec, 3)})
        if t1:
            before = spec_decode_counters(spec.get_metrics())
            seeded = [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens) for i in range(len(convs))]
            spec.chat(convs, seeded, use_tqdm=False)
            row["t1"] = _delta(spec_decode_counters(spec.get_metrics()), before)
        out["sets"][kind] = row
        log(f"acceptance {kind}: {row}")
    return out


def evaluate_shipped(shipped: Path, t1: bool = False, log=None, max_tokens: int = MAX_TOKENS,
                     num_prompts: int = NUM_PROMPTS) -> dict:
    """Materialize `shipped`, measure c and acceptance, and add them to its MANIFEST.json."""
    from speclab.models import smollm2_draft
    from speclab.models.llama import load_llama
    from speclab.models.smollm2 import model_dir

    def say(msg):
        print(f"[smollm2-draft eval] {msg}", file=sys.stderr, flush=True)

    log = log or say
    t0 = time.perf_counter()
    shipped = Path(shipped)
    if shipped.resolve() == smollm2_draft.SHIPPED.resolve():
        path, tmp = smollm2_draft.draft_dir(), None
    else:
        tmp = tempfile.TemporaryDirectory(prefix="smollm2-draft-")
        path = Path(tmp.name)
        smollm2_draft.materialize(shipped, model_dir(), path)
    c = cost_ratio(load_llama(model_dir()), load_llama(path))
    log(f"cost ratio {c}")
    acc = acceptance(path, t1=t1, max_tokens=max_tokens, num_prompts=num_prompts, log=log)
    manifest = json.loads((shipped / "MANIFEST.json").read_text())
    manifest["shipped_bytes"] = sum(p.stat().st_size for p in shipped.iterdir()        # the weights and config
                                    if p.is_file() and p.name != "MANIFEST.json")
    manifest["cost_ratio"] = c
    manifest["acceptance"] = acc
    manifest["evaluation"] = {"seconds": round(time.perf_counter() - t0, 1), "torch_threads": torch.get_num_threads(),
                              "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              "command": f"python -m speclab.train.smollm2_draft --eval-only --eval-max-tokens {max_tokens} "
                                         f"--eval-prompts {num_prompts}" + (" --eval-t1" if t1 else ""),
                              "machine": "2-core AMD EPYC shared with other jobs (contended): "
                                         "tok/s are one run's ratios"}
    (shipped / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if tmp is not None:
        tmp.cleanup()
    return manifest
