"""Teacher data: the real model's own answers to the training conversations (for drafts and EAGLE heads).

A draft (or an EAGLE head) is distilled to predict what the *target* would say, so its training text
is the target's own output (sequence-level distillation, as in DistillSpec and Medusa-2's
self-distillation), not human text. `build_teacher_data` runs speclab's engine on
`LLM(model="smollm2")` (SmolLM2-135M-Instruct, Q4_1-dequantized, float32) over the training
conversations of `speclab.data.train_prompts` (train-split stdlib modules, disjoint from the
held-out sets): every conversation greedily, then T=1 samples of some of them (seeded), and writes

    cache_root() / "smollm2-teacher-v1" / teacher.pt       torch.save of a dict:
        "token_ids":   list[list[int]]  chat-templated prompt ids + response ids (the response ends
                                        with the template's end token <|im_end|> when it finished)
        "prompt_lens": list[int]        where each response starts
        "ids":         list[str]        "<train prompt id>#greedy" or "<train prompt id>#t1s<seed>"
        "temperature": list[float]      0.0 or 1.0
    cache_root() / "smollm2-teacher-v1" / MANIFEST.json    written last: its presence means complete

Reproduce the committed set (768 answers: every conversation greedily and once at T=1; about 10
minutes on 2 quiet CPU cores at batch 32):

    python -m speclab.train.teacher --sample-every 1 --n-sample 384   # also --n-greedy, --budget-minutes, --resume
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

NAME = "smollm2-teacher-v1"
COMMAND = "python -m speclab.train.teacher"
CHUNK = 32          # conversations per LLM.chat call; the time budget is checked between chunks
SAMPLE_EVERY = 3    # after every 3rd greedy answer, one T=1 answer of the same conversation (while n_sample lasts)


def teacher_dir() -> Path:
    from speclab.models.smollm2 import cache_root
    return cache_root() / NAME


def load_teacher_data(path: str | Path | None = None) -> dict:
    """The teacher data dict (see the module docstring); FileNotFoundError naming the command if absent."""
    where = Path(path) if path is not None else teacher_dir()
    if not (where / "MANIFEST.json").is_file() or not (where / "teacher.pt").is_file():
        raise FileNotFoundError(f"no complete teacher data at {where}: build it with `{COMMAND}` "
                                f"(about 10 minutes on 2 CPU cores; needs the real model, `make setup`)")
    return torch.load(where / "teacher.pt", weights_only=True)


def teacher_manifest(path: str | Path | None = None) -> dict:
    where = Path(path) if path is not None else teacher_dir()
    return json.loads((where / "MANIFEST.json").read_text())


def _order(records: list[dict], salt: str) -> list[dict]:
    return sorted(records, key=lambda r: hashlib.sha256((salt + r["id"]).encode()).hexdigest())


def build_teacher_data(n_greedy: int | None = None, n_sample: int = 128, max_tokens: int = 256,
                       max_num_seqs: int = 32, budget_minutes: float | None = None,
                       out: str | Path | None = None, verbose: bool = True, resume: bool = False,
                       sample_every: int = SAMPLE_EVERY) -> Path:
    """Generate the teacher data and write teacher.pt, then MANIFEST.json, into `out` (default teacher_dir()).

    Args:
        n_greedy: conversations answered greedily (default: all training conversations), in a fixed
            hash order, so a smaller count is a prefix of a larger one.
        n_sample: conversations answered once more at temperature 1 (seed = their index; every
            `sample_every`-th one, interleaved with the greedy answers).
        max_tokens: new tokens per answer at most.
        max_num_seqs: the engine's batch.
        budget_minutes: stop starting new chunks of CHUNK conversations after this much time (at
            least one chunk runs; the counts actually generated are in the manifest).
        resume: keep the answers of an earlier run in `out` (same prompts version and settings) and
            generate only the missing ones; seconds and the command add up.
    """
    from speclab.data.train_prompts import load_train_prompts, train_prompts_version
    from speclab.llm import LLM
    from speclab.sampling_params import SamplingParams
    from speclab.chat import chat_prompt_ids

    t0 = time.perf_counter()
    out = Path(out) if out is not None else teacher_dir()
    records = _order(load_train_prompts(), "teacher")
    n_greedy = len(records) if n_greedy is None else min(n_greedy, len(records))
    jobs = []                # greedy and T=1 interleaved, so a time budget keeps both kinds
    for i, r in enumerate(records[:n_greedy]):
        jobs.append((r, 0.0, None))
        if i % sample_every == 0 and i // sample_every < n_sample:
            jobs.append((r, 1.0, i))
    llm = LLM(model="smollm2", max_num_seqs=max_num_seqs, kv_cache_gb=2.0, dtype=torch.float32)
    tok = llm.tokenizer
    data = {"token_ids": [], "prompt_lens": [], "ids": [], "temperature": []}
    finished = tokens = 0
    earlier = {"seconds": 0.0, "commands": []}
    if resume and (out / "teacher.pt").is_file():
        old = json.loads((out / "MANIFEST.json").read_text()) if (out / "MANIFEST.json").is_file() else None
        if old is None or old["prompts"]["version"] != train_prompts_version() or old["max_tokens"] != max_tokens:
            raise ValueError(f"cannot resume {out}: it is incomplete or was built with other prompts or max_tokens; "
                             f"run without --resume to rebuild it")
        data = torch.load(out / "teacher.pt", weights_only=True)
        finished, tokens = old["counts"]["finished_with_end_token"], old["tokens"]["response"]
        earlier = {"seconds": old["seconds"], "commands": old.get("commands", [old["command"]])}
        done = set(data["ids"])
        jobs = [j for j in jobs if (f"{j[0]['id']}#greedy" if j[2] is None else f"{j[0]['id']}#t1s{j[2]}") not in done]
    out.mkdir(parents=True, exist_ok=True)
    command = COMMAND + (" " + " ".join(sys.argv[1:]) if __name__ == "__main__" and sys.argv[1:] else "")

    def save(stopped_early: bool, run_finished: bool) -> float:
        """teacher.pt, then MANIFEST.json, each replaced atomically: after every chunk, a consistent set."""
        (out / "MANIFEST.json").unlink(missing_ok=True)          # absent while teacher.pt changes
        torch.save(data, out / "teacher.pt.tmp")
        os.replace(out / "teacher.pt.tmp", out / "teacher.pt")
        seconds = time.perf_counter() - t0 + earlier["seconds"]
        manifest = {
            "name": NAME,
            "model": "SmolLM2-135M-Instruct, Q4_1-dequantized (speclab.models.smollm2), float32, speclab engine",
            "prompts": {"source": "speclab/data/train_prompts.json", "version": train_prompts_version(),
                        "num_conversations": len(records)},
            "counts": {"answers": len(data["ids"]), "greedy": sum(t == 0 for t in data["temperature"]),
                       "t1": sum(t == 1 for t in data["temperature"]), "finished_with_end_token": finished,
                       "stopped_by_budget": stopped_early, "run_finished": run_finished},
            "tokens": {"prompt": sum(data["prompt_lens"]), "response": tokens},
            "max_tokens": max_tokens,
            "max_num_seqs": max_num_seqs,
            "seconds": round(seconds, 1),
            "response_tokens_per_second": round(tokens / seconds, 1),
            "command": command,
            "commands": earlier["commands"] + [command],
            "machine": {"platform": platform.platform(), "processor": _cpu_name(), "cpus": os.cpu_count(),
                        "torch_threads": torch.get_num_threads(),
                        "load_average_1min_at_save": round(os.getloadavg()[0], 2)},
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "format": {"teacher.pt": "dict: token_ids list[list[int]] (prompt + response), prompt_lens list[int], "
                                     "ids list[str], temperature list[float]"},
        }
        (out / "MANIFEST.json.tmp").write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(out / "MANIFEST.json.tmp", out / "MANIFEST.json")
        return seconds

    stopped_early = False
    for start in range(0, len(jobs), CHUNK):
        if budget_minutes is not None and start > 0 and time.perf_counter() - t0 > 60 * budget_minutes:
            stopped_early = True
            break
        chunk = jobs[start:start + CHUNK]
        params = [SamplingParams(temperature=t, seed=s, max_tokens=max_tokens) for _, t, s in chunk]
        outs = llm.chat([r["messages"] for r, _, _ in chunk], params, use_tqdm=verbose)
        for (r, t, s), o in zip(chunk, outs):
            prompt = chat_prompt_ids(tok, r["messages"])
            assert list(o.prompt_token_ids) == prompt
            resp = list(o.outputs[0].token_ids)
            data["token_ids"].append(prompt + resp)
            data["prompt_lens"].append(len(prompt))
            data["ids"].append(f"{r['id']}#greedy" if s is None else f"{r['id']}#t1s{s}")
            data["temperature"].append(float(t))
            finished += o.outputs[0].finish_reason == "stop"
            tokens += len(resp)
        save(False, False)                  # a killed run keeps every finished chunk (resume with --resume)
        if verbose:
            el = time.perf_counter() - t0
            print(f"[teacher] {len(data['ids'])} answers ({min(start + CHUNK, len(jobs))}/{len(jobs)} of this run), "
                  f"{tokens} response tokens, {el:.0f} s this run", file=sys.stderr, flush=True)
    seconds = save(stopped_early, True)
    if verbose:
        print(f"[teacher] wrote {out}: {len(data['ids'])} answers, {tokens} tokens, {seconds:.0f} s",
              file=sys.stderr, flush=True)
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-greedy", type=int, default=None, help="greedy answers (default: every conversation)")
    p.add_argument("--n-sample", type=int, default=128, help="T=1 answers (of the first conversations)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--budget-minutes", type=float, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--resume", action="store_true", help="keep an earlier run's answers, generate the rest")
    p.add_argument("--sample-every", type=int, default=SAMPLE_EVERY,
                   help="a T=1 answer for every N-th conversation (1: every one; seeds are the conversation's index, "
                        "so --resume with a smaller N adds answers and keeps the earlier ones)")
    a = p.parse_args(argv)
    build_teacher_data(a.n_greedy, a.n_sample, a.max_tokens, a.max_num_seqs, a.budget_minutes, a.out, resume=a.resume,
                       sample_every=a.sample_every)


if __name__ == "__main__":
    main()
