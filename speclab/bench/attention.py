"""Whole forwards with attention in speclab's paged CPU kernel against torch's gather + SDPA path.

    python -m speclab.bench attention --target smollm2 [--json PATH] [--rounds 4] [--calls 5]

Each row is one forward of the target (float32, one thread by default) with its logits: batch-1
decode, a 5-token verify step and a tree verify step (bench heads' static 4-node tree of EAGLE drafts,
lesson 10) over 200 cached tokens, batch 8 the same over 141-313 cached tokens (the vs-vllm prompts'
lengths plus 100), batch 32 decode over about 150, a 213-token prefill and eight prompts prefilled
at once (909 tokens). Both paths run the same forward on the
same caches, interleaved (kernel first in even rounds, torch first in odd ones), each row the
median of `--calls` forwards per round and the ratio the median over rounds with its range.
`argmax_identical`: both paths pick the same token at every row of the forward's logits (they round
differently, so a near-tie could differ; it did in none of these rows on 2026-12-02). Speeds are
printed, never asserted; the machine's load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from speclab.engine.batch import TreeChunk, flatten
from speclab.kv_cache import KVCacheManager
from speclab.models import cpu_attention
from speclab.models.hub import model_directory
from speclab.models.llama import load_llama
from speclab.timing import machine_info

PROMPT_LENGTHS = [89, 145, 96, 103, 213, 172, 50, 41]  # the 8 vs-vllm chats' lengths (SmolLM2 template)
ROWS = {  # name -> (cached tokens per request, new tokens per request)
    "batch 1 decode": ([200], 1),
    "batch 1 verify (5 tokens)": ([200], 5),
    "batch 1 tree verify (root + 4 nodes)": ([200], "tree"),
    "batch 8 decode": ([n + 100 for n in PROMPT_LENGTHS], 1),
    "batch 8 verify (5 tokens each)": ([n + 100 for n in PROMPT_LENGTHS], 5),
    "batch 8 tree verify (5 nodes each)": ([n + 100 for n in PROMPT_LENGTHS], "tree"),
    "batch 32 decode": ([150 + 3 * i for i in range(32)], 1),
    "batch 1 prefill (213 tokens)": ([0], 213),
    "batch 8 prefill (909 tokens)": ([0] * 8, PROMPT_LENGTHS),
}


# the tree rows' drafts: a root (the last committed token) and bench heads' static tree [(0,), (1,), (2,), (0, 0)]
TREE_DEPTHS = [0, 1, 1, 1, 2]
TREE_MASK = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 0, 1, 0], [1, 1, 0, 0, 1]],
                         dtype=torch.bool)  # node i sees the nodes of its line (root, its parent, itself)


def forward_case(model, cached: list[int], new, seed: int = 0):
    """(input batch, caches) for one forward of `new` tokens per request over `cached` ones ("tree":
    the 5 nodes of TREE_MASK, each at the position of its depth)."""
    tree = new == "tree"
    new = [len(TREE_DEPTHS)] * len(cached) if tree else new if isinstance(new, list) else [new] * len(cached)
    kv = KVCacheManager(sum((c + n) // 16 + 2 for c, n in zip(cached, new)) + 2, 16)
    caches = model.allocate_kv_cache(kv.pool.num_blocks, 16)
    g = torch.Generator().manual_seed(seed)
    chunks = []
    for i, (c, n) in enumerate(zip(cached, new)):
        kv.allocate(str(i), 0, c + n)
        ids = torch.randint(0, model.config.vocab_size, (c + n,), generator=g).tolist()
        if c:
            model(*flatten(kv, [(str(i), ids[:c], 0)]), caches)
        chunks.append((str(i), ids[c:], c, TreeChunk([c + d for d in TREE_DEPTHS], c, TREE_MASK)) if tree
                      else (str(i), ids[c:], c))
    return flatten(kv, chunks), caches


def run(model, batch, caches) -> torch.Tensor:
    return model.compute_logits(model(*batch, caches)[0])


def compare(model, rounds: int, calls: int) -> list[dict]:
    """The rows: kernel and torch milliseconds (medians), torch / kernel per round, same argmax."""
    cases = {name: forward_case(model, *spec) for name, spec in ROWS.items()}
    applies = cpu_attention.applies
    paths = {"kernel": applies, "torch": lambda *args: False}
    times = {(name, p): [] for name in cases for p in paths}
    argmax = {}
    try:
        for name, (b, c) in cases.items():  # warm-up, and the packed copies a batch's verify rows make
            for _ in range(10):
                run(model, b, c)
        for r in range(rounds):
            for p in (("kernel", "torch") if r % 2 == 0 else ("torch", "kernel")):
                cpu_attention.applies = paths[p]
                for name, (b, c) in cases.items():
                    ts = []
                    for _ in range(calls):
                        t0 = time.perf_counter()
                        logits = run(model, b, c)
                        ts.append(time.perf_counter() - t0)
                    times[(name, p)].append(statistics.median(ts))
                    argmax[(name, p)] = logits.argmax(-1)
    finally:
        cpu_attention.applies = applies
    rows = []
    for name in cases:
        k, t = times[(name, "kernel")], times[(name, "torch")]
        ratios = [tt / kk for tt, kk in zip(t, k)]
        rows.append({"forward": name, "kernel_ms": 1e3 * statistics.median(k), "torch_ms": 1e3 * statistics.median(t),
                     "speedup": statistics.median(ratios), "speedup_range": [min(ratios), max(ratios)],
                     "argmax_identical": bool(torch.equal(argmax[(name, "kernel")], argmax[(name, "torch")]))})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m speclab.bench attention", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="target", help="'target' (embedded), 'smollm2', or a checkpoint directory")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    ap.add_argument("--calls", type=int, default=5, help="forwards per row, path and round (their median)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the kernel runs only with 1)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads != 1:
        raise SystemExit("the kernel runs with one torch thread only (with more, SDPA uses them all): use --threads 1")
    torch.set_num_threads(args.threads)
    if not cpu_attention.available():
        raise SystemExit(f"speclab's attention kernel is not available here ({cpu_attention.why_unavailable()}): "
                         "install g++ or clang++ (or set CXX), and unset SPECLAB_CPU_ATTENTION=0")
    info = machine_info(args.threads)
    print(f"attention: {args.target} float32, whole forwards with logits, kernel vs gather + SDPA; {args.rounds} "
          f"interleaved rounds x median of {args.calls}; {info['cpu']}, {info['cores']} cores, torch {info['torch']}, "
          f"{args.threads} thread; load average {info['load_average']}")
    model = load_llama(model_directory(args.target), dtype=torch.float32)
    rows = compare(model, args.rounds, args.calls)
    print(f"\n{'forward':<40}{'kernel ms':>10}{'torch ms':>10}{'torch / kernel':>22}  same argmax")
    for r in rows:
        lo, hi = r["speedup_range"]
        print(f"{r['forward']:<40}{r['kernel_ms']:>10.1f}{r['torch_ms']:>10.1f}{r['speedup']:>10.2f}x ({lo:.2f}-{hi:.2f})"
              f"  {'yes' if r['argmax_identical'] else 'NO'}")
    info["load_average_at_the_end"] = machine_info()["load_average"]
    print(f"\nload average at the end {info['load_average_at_the_end']}; compare rows of one run.")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "target": args.target, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
