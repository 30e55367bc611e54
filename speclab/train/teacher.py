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

Reproduce the set the shipped heads and draft were trained on (768 answers: every conversation
greedily and once at T=1; 50 minutes on 2 CPU cores at batch 32 on 2026-12-02, sharing the machine
with other work; 130,958 response tokens, where the shipped heads' manifests record 130,972 from
2026-11-29: float rounding in the engine has moved since, and with it a few greedy tokens):

    python -m speclab.train.teacher --sample-every 1 --n-sample 384   # also --n-greedy, --budget-minutes, --resume

Grow it with more T=1 answers to the same conversations (`--samples N` answers each, after the first
pass; `--resume` keeps what is there, so a budgeted run can be continued). The set only ever grows at its
end, so its first 1,152 answers stay the shipped heads' and draft's data: their reproduce commands name
the answers they read (`--teacher-answers 1152` to speclab.train.heads and .smollm2_draft), and a head
trained on the grown set names its own count:

    python -m speclab.train.teacher --resume --sample-every 1 --n-sample 384 --samples 4 --budget-minutes 60

The extra answers come conversation by conversation, and the engine runs with prefix caching: a chunk
first prefills its few distinct prompts (a one-token call; requests admitted in the same step share no
blocks), then every answer in it reads its prompt from the cache. With 11 answers per conversation that
cut the forward's tokens 4.4x in a 24-answer test (2026-12-06).

One torch thread is faster than two here (OMP_NUM_THREADS=1: about 90 response tokens/s at batch 32 on
one core of a 2-core AMD EPYC, against 60 on both, where two threads leave the few-row attention kernel
for gather + SDPA), so the other core stays free for collecting hidden states or training.

The answers are committed too, compactly (`speclab/data/teacher_smollm2.npz`, token ids as uint16, and
its MANIFEST as `teacher_smollm2.json`; about 0.3 MB per 1,000 answers): a fresh clone restores them
into the cache on first use, so heads and drafts train without regenerating them, and `--resume`
grows the committed set. After growing it, `python -m speclab.train.teacher --save-committed` writes
the copy to commit.
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
from dataclasses import dataclass, field
from pathlib import Path

import torch

from speclab.cpu_info import cpu_name

NAME = "smollm2-teacher-v1"
COMMAND = "python -m speclab.train.teacher"
CHUNK = 32          # conversations per LLM.chat call; the time budget is checked between chunks
SAMPLE_EVERY = 3    # after every 3rd greedy answer, one T=1 answer of the same conversation (while n_sample lasts)
SEED_STRIDE = 100_000  # the seed of a conversation's k-th extra T=1 answer: its index + k * SEED_STRIDE
COMMITTED = Path(__file__).resolve().parents[1] / "data" / "teacher_smollm2.npz"  # the repository's copy


def teacher_dir() -> Path:
    from speclab.models.smollm2 import cache_root
    return cache_root() / NAME


def _complete(where: Path) -> bool:
    return (where / "MANIFEST.json").is_file() and (where / "teacher.pt").is_file()


def save_committed(where: str | Path | None = None, to: str | Path = COMMITTED) -> Path:
    """Write the teacher data of `where` (default teacher_dir()) into the repository's compact copy:
    `to` (an .npz: every answer's ids as uint16, concatenated, with offsets, prompt lengths,
    temperatures and answer ids) and its MANIFEST beside it (same name, .json). The answers take an
    hour of a CPU core per 300k tokens to regenerate; committed, they accumulate from run to run."""
    import numpy as np
    where = Path(where) if where is not None else teacher_dir()
    d, man = load_teacher_data(where), teacher_manifest(where)
    ids = d["token_ids"]
    if max(max(s) for s in ids) >= 2 ** 16:
        raise ValueError("token ids above 65535 do not fit the committed uint16 format")
    to = Path(to)
    np.savez_compressed(to.with_suffix(".tmp.npz"), tokens=np.concatenate([np.asarray(s, np.uint16) for s in ids]),
                        offsets=np.cumsum([0] + [len(s) for s in ids]), prompt_lens=np.asarray(d["prompt_lens"], np.int32),
                        temperature=np.asarray(d["temperature"], np.float32), ids=np.asarray(d["ids"]))
    os.replace(to.with_suffix(".tmp.npz"), to)
    to.with_suffix(".json").write_text(json.dumps(man, indent=1) + "\n")
    return to


def restore_committed(out: str | Path | None = None, src: str | Path = COMMITTED) -> Path:
    """Write the committed teacher data (save_committed's files) as a complete teacher directory `out`
    (default teacher_dir()), so that training reads it and `--resume` grows it."""
    import numpy as np
    src, out = Path(src), Path(out) if out is not None else teacher_dir()
    z = np.load(src)
    off = z["offsets"].tolist()
    toks = z["tokens"].astype(np.int64)
    data = {"token_ids": [toks[a:b].tolist() for a, b in zip(off[:-1], off[1:])],
            "prompt_lens": z["prompt_lens"].tolist(), "ids": [str(i) for i in z["ids"]],
            "temperature": [float(t) for t in z["temperature"]]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "MANIFEST.json").unlink(missing_ok=True)
    torch.save(data, out / "teacher.pt.tmp")
    os.replace(out / "teacher.pt.tmp", out / "teacher.pt")
    (out / "MANIFEST.json").write_text(src.with_suffix(".json").read_text())  # written last: complete
    return out


def _restore_if_absent(where: Path, wait_s: float = 30.0) -> None:
    """The cache's teacher directory from the committed copy, when the cache has none. A teacher.pt
    without its MANIFEST is a build saving a chunk (or one that died mid-save): wait for the manifest
    rather than overwrite a growing set with the committed one."""
    deadline = time.monotonic() + wait_s
    while (where / "teacher.pt").is_file() and not (where / "MANIFEST.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.5)
    if where == teacher_dir() and not (where / "teacher.pt").is_file() and COMMITTED.is_file():
        restore_committed(where)


def load_teacher_data(path: str | Path | None = None) -> dict:
    """The teacher data dict (see the module docstring), from the cache (restored from the repository's
    committed copy when absent); FileNotFoundError naming the command if there is neither."""
    where = Path(path) if path is not None else teacher_dir()
    _restore_if_absent(where)
    if not _complete(where):
        raise FileNotFoundError(f"no complete teacher data at {where}: build it with `{COMMAND}` "
                                f"(about 50 minutes on 2 CPU cores; needs the real model, `make setup`)")
    return torch.load(where / "teacher.pt", weights_only=True)


def teacher_manifest(path: str | Path | None = None) -> dict:
    where = Path(path) if path is not None else teacher_dir()
    _restore_if_absent(where)
    return json.loads((where / "MANIFEST.json").read_text())


def _order(records: list[dict], salt: str) -> list[dict]:
    return sorted(records, key=lambda r: hashlib.sha256((salt + r["id"]).encode()).hexdigest())


@dataclass
class _Build:
    """One build's settings, the answers so far, and what the earlier runs of a resumed build add up to."""
    out: Path
    num_conversations: int
    max_tokens: int
    max_num_seqs: int
    command: str
    t0: float                    # time.perf_counter() at the start of this run
    data: dict = field(default_factory=lambda: {"token_ids": [], "prompt_lens": [], "ids": [], "temperature": []})
    finished: int = 0            # answers that ended with the end token
    tokens: int = 0              # response tokens
    earlier: dict = field(default_factory=lambda: {"seconds": 0.0, "commands": []})


def _answer_id(record: dict, seed: int | None) -> str:
    """"<train prompt id>#greedy" or "<train prompt id>#t1s<seed>"."""
    return f"{record['id']}#greedy" if seed is None else f"{record['id']}#t1s{seed}"


def _jobs(records: list[dict], n_greedy: int | None, n_sample: int, sample_every: int,
          samples: int = 1) -> list[tuple]:
    """(record, temperature, seed) per answer: greedy and T=1 interleaved, so a time budget keeps both
    kinds; then, for samples > 1, rounds 2..samples of more T=1 answers to the same conversations
    (seed i + round * SEED_STRIDE), after the first pass, so that --resume with a larger --samples adds them."""
    n_greedy = len(records) if n_greedy is None else min(n_greedy, len(records))
    jobs, sampled = [], []
    for i, r in enumerate(records[:n_greedy]):
        jobs.append((r, 0.0, None))
        if i % sample_every == 0 and i // sample_every < n_sample:
            jobs.append((r, 1.0, i))
            sampled.append((i, r))
    # the extra answers conversation by conversation, so that a chunk holds a few conversations' answers and
    # their prompts are prefilled once (prefix caching, _answer_chunk)
    jobs += [(r, 1.0, i + k * SEED_STRIDE) for i, r in sampled for k in range(1, samples)]
    return jobs


def _command() -> str:
    """The command line of this run, as the manifest records it."""
    return COMMAND + (" " + " ".join(sys.argv[1:]) if __name__ == "__main__" and sys.argv[1:] else "")


def _resume(b: _Build, jobs: list[tuple]) -> list[tuple]:
    """Load an earlier run's answers and totals from b.out into `b`; return the jobs still to do."""
    from speclab.data.train_prompts import train_prompts_version

    out = b.out
    old = json.loads((out / "MANIFEST.json").read_text()) if (out / "MANIFEST.json").is_file() else None
    if old is None or old["prompts"]["version"] != train_prompts_version() or old["max_tokens"] != b.max_tokens:
        raise ValueError(f"cannot resume {out}: it is incomplete or was built with other prompts or max_tokens; "
                         f"run without --resume to rebuild it")
    b.data = torch.load(out / "teacher.pt", weights_only=True)
    b.finished, b.tokens = old["counts"]["finished_with_end_token"], old["tokens"]["response"]
    b.earlier = {"seconds": old["seconds"], "commands": old.get("commands", [old["command"]])}
    done = set(b.data["ids"])
    return [j for j in jobs if _answer_id(j[0], j[2]) not in done]


def _generate(b: _Build, llm, jobs: list[tuple], budget_minutes: float | None, verbose: bool) -> bool:
    """Answer the jobs CHUNK at a time, saving after each chunk; True if the time budget stopped it early."""
    for start in range(0, len(jobs), CHUNK):
        if budget_minutes is not None and start > 0 and time.perf_counter() - b.t0 > 60 * budget_minutes:
            return True
        _answer_chunk(b, llm, jobs[start:start + CHUNK], verbose)
        _save(b, False, False)              # a killed run keeps every finished chunk (resume with --resume)
        if verbose:
            el = time.perf_counter() - b.t0
            print(f"[teacher] {len(b.data['ids'])} answers ({min(start + CHUNK, len(jobs))}/{len(jobs)} of this run), "
                  f"{b.tokens} response tokens, {el:.0f} s this run", file=sys.stderr, flush=True)
    return False


def _answer_chunk(b: _Build, llm, chunk: list[tuple], verbose: bool) -> None:
    """One LLM.chat call over the chunk's conversations; append prompt + response ids to b.data."""
    from speclab.chat import chat_prompt_ids
    from speclab.sampling_params import SamplingParams

    params = [SamplingParams(temperature=t, seed=s, max_tokens=b.max_tokens) for _, t, s in chunk]
    unique = list({r["id"]: r for r, _, _ in chunk}.values())
    if len(unique) < len(chunk):  # prefill each prompt once: requests admitted in one step share no blocks,
        llm.chat([r["messages"] for r in unique], [SamplingParams(temperature=0, max_tokens=1)] * len(unique), use_tqdm=False)
    outs = llm.chat([r["messages"] for r, _, _ in chunk], params, use_tqdm=verbose)  # so they come after
    for (r, t, s), o in zip(chunk, outs):
        prompt = chat_prompt_ids(llm.tokenizer, r["messages"])
        assert list(o.prompt_token_ids) == prompt
        resp = list(o.outputs[0].token_ids)
        b.data["token_ids"].append(prompt + resp)
        b.data["prompt_lens"].append(len(prompt))
        b.data["ids"].append(_answer_id(r, s))
        b.data["temperature"].append(float(t))
        b.finished += o.outputs[0].finish_reason == "stop"
        b.tokens += len(resp)


def _save(b: _Build, stopped_early: bool, run_finished: bool) -> float:
    """Write teacher.pt, then MANIFEST.json, each atomically (a consistent set); return all runs' seconds."""
    out = b.out
    (out / "MANIFEST.json").unlink(missing_ok=True)          # absent while teacher.pt changes
    torch.save(b.data, out / "teacher.pt.tmp")
    os.replace(out / "teacher.pt.tmp", out / "teacher.pt")
    seconds = time.perf_counter() - b.t0 + b.earlier["seconds"]
    manifest = _manifest(b, seconds, stopped_early, run_finished)
    (out / "MANIFEST.json.tmp").write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(out / "MANIFEST.json.tmp", out / "MANIFEST.json")
    return seconds


def _manifest(b: _Build, seconds: float, stopped_early: bool, run_finished: bool) -> dict:
    """MANIFEST.json's contents: model, prompts, counts, tokens, settings, timing, commands and machine."""
    from speclab.data.train_prompts import train_prompts_version

    data = b.data
    return {
        "name": NAME,
        "model": "SmolLM2-135M-Instruct, Q4_1-dequantized (speclab.models.smollm2), float32, speclab engine",
        "prompts": {"source": "speclab/data/train_prompts.json", "version": train_prompts_version(),
                    "num_conversations": b.num_conversations},
        "counts": {"answers": len(data["ids"]), "greedy": sum(t == 0 for t in data["temperature"]),
                   "t1": sum(t == 1 for t in data["temperature"]), "finished_with_end_token": b.finished,
                   "stopped_by_budget": stopped_early, "run_finished": run_finished},
        "tokens": {"prompt": sum(data["prompt_lens"]), "response": b.tokens},
        "max_tokens": b.max_tokens,
        "max_num_seqs": b.max_num_seqs,
        "seconds": round(seconds, 1),
        "response_tokens_per_second": round(b.tokens / seconds, 1),
        "command": b.command,
        "commands": b.earlier["commands"] + [b.command],
        "machine": {"platform": platform.platform(), "processor": cpu_name(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(),
                    "load_average_1min_at_save": round(os.getloadavg()[0], 2)},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "format": {"teacher.pt": "dict: token_ids list[list[int]] (prompt + response), prompt_lens list[int], "
                                 "ids list[str], temperature list[float]"},
    }


def build_teacher_data(n_greedy: int | None = None, n_sample: int = 128, max_tokens: int = 256,
                       max_num_seqs: int = 32, budget_minutes: float | None = None,
                       out: str | Path | None = None, verbose: bool = True, resume: bool = False,
                       sample_every: int = SAMPLE_EVERY, samples: int = 1) -> Path:
    """Generate the teacher data and write teacher.pt, then MANIFEST.json, into `out` (default teacher_dir()).

    Args:
        n_greedy: conversations answered greedily (default: all training conversations), in a fixed
            hash order, so a smaller count is a prefix of a larger one.
        n_sample: conversations answered once more at temperature 1 (seed = their index; every
            `sample_every`-th one, interleaved with the greedy answers).
        samples: T=1 answers to each of those conversations (the first interleaved as above, the rest
            after the first pass, with seeds index + k * SEED_STRIDE): more of the target's own text
            from the same prompts, with no new prompts to write.
        max_tokens: new tokens per answer at most.
        max_num_seqs: the engine's batch.
        budget_minutes: stop starting new chunks of CHUNK conversations after this much time (at
            least one chunk runs; the counts actually generated are in the manifest).
        resume: keep the answers of an earlier run in `out` (same prompts version and settings) and
            generate only the missing ones; seconds and the command add up.
    """
    from speclab.data.train_prompts import load_train_prompts
    from speclab.llm import LLM

    t0 = time.perf_counter()
    out = Path(out) if out is not None else teacher_dir()
    records = _order(load_train_prompts(), "teacher")
    if samples < 1:
        raise ValueError(f"samples={samples}: at least 1 T=1 answer per sampled conversation (use n_sample=0 for none)")
    jobs = _jobs(records, n_greedy, n_sample, sample_every, samples)
    llm = LLM(model="smollm2", max_num_seqs=max_num_seqs, kv_cache_gb=2.0, dtype=torch.float32, enable_prefix_caching=True)
    b = _Build(out, len(records), max_tokens, max_num_seqs, _command(), t0)
    if resume:
        _restore_if_absent(out)
    if resume and (out / "teacher.pt").is_file():
        jobs = _resume(b, jobs)
    out.mkdir(parents=True, exist_ok=True)
    stopped_early = _generate(b, llm, jobs, budget_minutes, verbose)
    seconds = _save(b, stopped_early, True)
    if verbose:
        print(f"[teacher] wrote {out}: {len(b.data['ids'])} answers, {b.tokens} tokens, {seconds:.0f} s",
              file=sys.stderr, flush=True)
    return out


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
    p.add_argument("--samples", type=int, default=1,
                   help="T=1 answers per sampled conversation (the extra ones come after the first pass, so "
                        "--resume with a larger N adds them)")
    p.add_argument("--save-committed", action="store_true",
                   help=f"only copy the cache's teacher data into the repository ({COMMITTED.name}, with its "
                        f"manifest), to commit; a fresh clone then trains from it and --resume grows it")
    a = p.parse_args(argv)
    if a.save_committed:
        print(f"[teacher] wrote {save_committed()}", file=sys.stderr)
        return
    build_teacher_data(a.n_greedy, a.n_sample, a.max_tokens, a.max_num_seqs, a.budget_minutes, a.out, resume=a.resume,
                       sample_every=a.sample_every, samples=a.samples)


if __name__ == "__main__":
    main()
