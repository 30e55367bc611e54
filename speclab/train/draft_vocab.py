"""Rank the target's vocabulary by how often it writes each token, for a reduced draft vocabulary.

FR-Spec (Zhao et al. 2025) keeps the tokens most frequent in a large corpus. A draft wants the tokens
its *target* writes, so here a token's score is its expected count in the target's own answers to the
training conversations (the teacher data, speclab/train/teacher.py, train-split sources only): the
sum over the answers' positions of p(v | context), the target's probability of writing v there.
These soft counts see every token the target might write at a position, not only the one it did,
so a few hundred answers rank tens of thousands of tokens; ties (tokens it never gives weight to)
go by id. The ranking, most frequent first, is written beside the draft as
`token_ranking.json` (speclab.models.draft_vocab), and the draft's MANIFEST.json records the
data and, per draft_vocab_size, the coverage: the share of the target's probability mass that falls
inside the kept tokens at the positions of the held-out answers (by source, as the draft's training
split them). A draft can only propose a kept token, so coverage bounds its acceptance.

    python -m speclab.train.teacher --sample-every 1 --n-sample 384 --budget-minutes 12   # if not cached
    python -m speclab.train.draft_vocab           # writes speclab/checkpoints/smollm2-draft/token_ranking.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from speclab.models.draft_vocab import RANKING_FILE

SIZES = (1024, 2048, 4096, 8192, 16384, 32768)  # draft_vocab_size values whose coverage is recorded


@torch.no_grad()
def soft_counts(target, seqs: list[list[int]], starts: list[int]) -> torch.Tensor:
    """(V,) float64: sum over every answer position t >= start of p(. | seq[:t]) under the target.

    target: a causal LM called as target(input_ids=(1, T)) -> .logits (1, T, V) (transformers').
    """
    total = None
    for ids, start in tqdm(list(zip(seqs, starts)), desc="target probabilities", mininterval=5):
        logits = target(input_ids=torch.tensor([ids])).logits[0, start - 1:-1]  # rows that predict the answer
        p = F.softmax(logits.double(), dim=-1).sum(0)  # (V,)
        total = p if total is None else total + p
    return total


def ranking_from_scores(scores: torch.Tensor) -> torch.Tensor:
    """(V,) scores -> (V,) int64 token ids, highest score first, ties by the smaller id."""
    return torch.argsort(-scores.double(), stable=True)  # stable: equal scores stay in id order


def coverage(ranking: torch.Tensor, mass: torch.Tensor, sizes=SIZES) -> dict[int, float]:
    """Share of `mass` (V,) (the target's summed probabilities) inside each first-n of the ranking."""
    total = float(mass.sum())
    return {n: round(float(mass[ranking[:n]].sum()) / total, 4) for n in sizes if n <= ranking.numel()}


def build(out_dir: Path, answers: int | None = None, log=print) -> dict:
    """Score the teacher answers (train split), write the ranking into out_dir, return its record."""
    from speclab.train.smollm2_draft import _is_val, load_target
    from speclab.train.teacher import load_teacher_data, teacher_manifest

    t0 = time.perf_counter()
    data, tman = load_teacher_data(), teacher_manifest()
    if answers is not None:
        data = {k: v[:answers] for k, v in data.items()}
    split = [_is_val(i) for i in data["ids"]]
    rows = list(zip(data["token_ids"], data["prompt_lens"], split))
    train = [(ids, s) for ids, s, v in rows if not v]
    val = [(ids, s) for ids, s, v in rows if v]
    target = load_target()
    scores = soft_counts(target, [r[0] for r in train], [r[1] for r in train])
    ranking = ranking_from_scores(scores)
    held = soft_counts(target, [r[0] for r in val], [r[1] for r in val])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RANKING_FILE).write_text(json.dumps({"about": "SmolLM2-135M-Instruct's token ids, most often written "
                                                             "first (speclab.train.draft_vocab)",
                                                    "ranking": ranking.tolist()}, separators=(",", ":")) + "\n")
    record = {
        "file": RANKING_FILE, "score": "expected count in the target's own answers: sum over answer positions of "
                                       "p(v | context), SmolLM2-135M-Instruct (float32, transformers' forward)",
        "data": {"teacher": tman.get("name"), "teacher_command": tman.get("command"),
                 "teacher_counts": tman.get("counts"), "answers": len(rows), "train_answers": len(train),
                 "train_positions": sum(len(ids) - s for ids, s in train), "heldout_answers": len(val),
                 "heldout_positions": sum(len(ids) - s for ids, s in val)},
        "heldout_coverage": {str(n): c for n, c in coverage(ranking, held).items()},
        "train_coverage": {str(n): c for n, c in coverage(ranking, scores).items()},
        "seconds": round(time.perf_counter() - t0, 1),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m speclab.train.draft_vocab" + (f" --answers {answers}" if answers is not None else ""),
    }
    log(f"wrote {out_dir / RANKING_FILE}; held-out coverage by draft_vocab_size: {record['heldout_coverage']}")
    return record


def main(argv=None) -> None:
    from speclab.models.smollm2_draft import SHIPPED

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(SHIPPED), help="the draft's directory (default: the shipped SmolLM2 draft)")
    p.add_argument("--answers", type=int, default=None, help="the first N teacher answers only (default: all)")
    a = p.parse_args(argv)
    out = Path(a.out)
    record = build(out, a.answers)
    manifest = out / "MANIFEST.json"
    if manifest.is_file():  # the draft's record says where its ranking came from
        m = json.loads(manifest.read_text())
        m["token_ranking"] = record
        manifest.write_text(json.dumps(m, indent=1) + "\n")


if __name__ == "__main__":
    main()
