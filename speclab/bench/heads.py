"""`python -m speclab.bench heads [--k 2 4 8] [--json PATH]`: every proposer side by side at batch 1 (lessons 08, 10).

For each prompt set and temperature: plain decoding, n-gram, the draft model (`draft`, or
`smollm2-draft` for SmolLM2, which also runs over the 8192 tokens the target writes most:
`draft_vocab_size`, speclab.models.draft_vocab), the heads (EAGLE, EAGLE-3-style, Medusa, MTP on
the embedded target; EAGLE on SmolLM2), and the trees (lesson 10): EAGLE's static `speculative_token_tree`
and EAGLE-2 dynamic tree, and on SmolLM2 the draft model's star (its k most likely next tokens), each with
as many nodes as the chain has drafts, so chain and trees verify the same number of tokens per step; and
every tree once more with prompt lookup's chain of up to `--graft-tokens` tokens grafted in (`graft_method`,
speclab.proposers.graft: its k, the verified budget, is the tree's nodes plus the chain's). At T > 0 EAGLE's static
tree runs once more with its children drawn from q, and so does the drawn tree (`drawn_tree`; `draft_sample_method`
"probabilistic" with a static tree, speclab.proposers.tree_drafting); `--seed` picks the engines' stream.
Every row is one LLM; the rows share the target's weights (`speclab.llm.shared_weights`). `--repeats` interleaved rounds: in each round every row runs every
set once, so drifting load falls on all rows alike; times are medians over the rounds and a
speedup's range is over the rounds (each against the plain row of its own round).

Reported per row: tokens/s, speedup over plain decoding, the decode phase's speedup (the same with
each prompt's prefill taken out: the target's forwards over more than k + 1 tokens, which every row
runs alike, and the first token they produce; at SmolLM2's 48 tokens per answer a prompt's prefill
was 8-23 % of plain decoding's time on 2026-12-03's Zen 3, so the end-to-end figure dilutes what
speculation does to the decode steps, which vLLM's benchmarks report as TPOT), acceptance per position (accepted at
position i, a tree's depth i, / drafts), acceptance rate (accepted / drafted: a tree drafts more
tokens than it can keep), mean acceptance length tau (1 + accepted / drafts), the drafting cost c
(the proposer's time per drafted token over the plain row's time per token) and, at T = 0,
whether the output equals plain greedy decoding token for token (in the run's dtype, the first of
`--dtypes`: float32 unless told; in bfloat16 greedy output is compared with bfloat16 plain decoding).
Batch 1: compare rows of one run. With several `--k`, one plain row and every k's rows share the
rounds, and the fastest configuration of each method (over k, trees and draft vocabularies) per set
and temperature is printed and written as `best` (a maximum over noisy rows leans high: its range is beside it).

Every row generates the same number of tokens: greedy chats stop at the model's EOS, where all
rows stop alike (their outputs are identical); sampled ones (T > 0) go on to --max-tokens
(`ignore_eos`), since a sampled answer that ends early would put its prompt's prefill on a few
tokens and make that row look slow (an EAGLE row at T = 1 once read 0.20x so). Tokens are counted
per round.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from speclab.data.chat_prompts import load_chat_prompts
from speclab.data.prompts import load_prompts
from speclab.llm import LLM, shared_weights
from speclab.models.smollm2_draft import DRAFT_VOCAB
from speclab.proposers.graft import GRAFT_TOKENS, NGRAM_GRAFT
from speclab.sampling_params import SamplingParams
from speclab.timing import forward_seconds, machine_info, timed, wrap_timed
from speclab.verify.tree import parse_tree, star_literal

EMBEDDED_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "medusa", "mtp")
# EAGLE's static trees at a verified budget of k nodes (the chain's k), chosen by measurement: SmolLM2's
# shipped head, greedy, 3 held-out chats per set x 48 tokens, mean acceptance length (load ~7, 2026-12-01):
#   k = 4: chain 1.549, [(0,), (1,), (0, 0), (0, 0, 0)] 1.662, [(0,), (1,), (2,), (0, 0)] 1.692
#   k = 6: chain 1.549, [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)] 1.730,
#          [(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)] 1.740, a deeper one (depth 4) 1.697
# The head is right at position 1 about half the time and rarely after: width pays, depth does not.
# Larger budgets, where a verify step of up to 16 rows costs little more than a decode step (bfloat16 on
# AMX: 9 tokens 1.21 decode steps), measured the same way in bfloat16 (the head continued to 1.07M tokens,
# 2026-12-04, Intel Xeon; mean tau over edit / codegen / qa / chat; 3 chats per set x 48 tokens):
#   k = 8:  [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (0, 0, 0)] 1.995 (2.10 / 2.12 / 2.14 / 1.62);
#           with (2, 0) for (3,) 1.975, with (4,) for (0, 1) 1.959, deeper (0, 0, 1) for (2,) 1.967
#   k = 12: the k = 8 tree + (2, 0), (0, 2), (1, 1), (0, 1, 0)  2.107;  k = 16 (17 rows) 2.165
# and the EAGLE-2 dynamic trees (steps, topk) at the same budgets: k = 6 (3, 3) 1.989 (static 1.896),
# k = 8 (3, 4) 2.090 and (4, 3) 2.080, k = 12 (4, 4) 2.178, k = 16 (4, 4) 2.188 (chat 1.65 in all):
# ranked by the draft's probabilities, a tree spends its budget where the head is confident.
STATIC_TREES = {2: "[(0,), (1,)]", 3: "[(0,), (1,), (2,)]", 4: "[(0,), (1,), (2,), (0, 0)]",
                6: "[(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)]",
                8: "[(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]",
                12: "[(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 2), (1, 1), (0, 1, 0)]"}
DYNAMIC_TREES = {6: (3, 3), 8: (3, 4), 12: (4, 4)}  # k -> (speculative_num_steps, speculative_eagle_topk); else (k - 1, 2)
# The draft model drafts a star: its k most likely next tokens, all at depth 1
# (`speclab.verify.tree.star_literal`). Each depth of a tree costs the draft a forward of the whole model
# (4 layers and an LM head), where it costs a head one layer; the draft's first token is right 0.3-0.5 of
# the time and its second rarely, so width pays and depth does not. SmolLM2's draft in bfloat16 over 8192
# tokens, float32 target, 2 chats per set x 48 tokens, 3 rounds, one thread (Zen 4 EPYC, load 0.5-1.0,
# 2026-12-07), speedup on edit / codegen / qa / chat in one run: the 3-star 1.29 / 1.23 / 1.13 / 1.20x, the
# 4-star 1.36 / 1.30 / 1.20 / 1.34x, the 5-star 1.25 / 1.29 / 1.16 / 1.26x, [(0,), (1,), (2,), (0, 0)] 1.29 /
# 1.12 / 1.11 / 1.25x; in the three other runs the 3-star won (1.35-1.43 / 1.26-1.36 / 1.18-1.24 /
# 1.24-1.36x; the 4-star 1.24-1.25 / 1.21-1.24 / 1.09-1.10 / 1.19-1.21x), EAGLE-2 dynamic trees of 3 and 4
# nodes read 1.03-1.08x on qa and chat, and the k = 3 chain 0.96-1.08x there (MEASUREMENTS.md).


# At T > 0 a top-k child is kept with probability p(x) alone, so the trees above lose to the chain there; children
# drawn from q are kept with min(1, p / q) each. EAGLE's drawn tree: DRAWN_ROOT_CHILDREN = 3 children at the root
# and the chain under the first (`drawn_tree`). Chosen on SmolLM2 at T = 1 (shipped head in bfloat16, float32 target,
# one thread, the Zen 4 EPYC, 2026-12-07). Mean acceptance length over 8 held-out chats per set x 48 tokens x 3
# rounds, qa / chat: the chain of 3 1.64 / 1.45; drawn, 2 root children 1.79 / 1.50, 3 1.92 / 1.59, 4 1.85 / 1.65,
# [(0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0)] 1.93 / 1.60, 3 children and a chain to depth 4 1.76 / 1.58. Speedup
# over 4 chats per set, 3 interleaved rounds (load 0.8-1.0): the chain 1.24 / 1.19x, 2 root children 1.31 / 1.18x,
# 3 1.28 / 1.28x (4 and 5 children, before the drawing and the walk were made cheaper: below 3's on both sets). The
# 3-star alone with drawn children, beside it in another run: 1.18 / 1.36x (its top-k children 1.11 / 1.26x, the
# drawn tree 1.27 / 1.33x), so at T > 0 the static tree runs with drawn children too.
DRAWN_ROOT_CHILDREN = 3


@dataclass
class Row:
    """One configuration: its label in the table, its speculative config (None: plain)."""

    method: str
    k: int
    tree: str | None
    spec: dict | None
    head: str | None = None  # an EAGLE row's head directory or name, when not the target's shipped one
    draft_dtype: str | None = None  # a model drafter's dtype when set apart from the target's (draft_dtype)
    graft_tokens: int = 0  # prompt-lookup tokens grafted into its tree (graft_method "ngram"); k counts them


def grafted(r: Row, m: int) -> Row:
    """The tree row r with an n-gram chain of up to m tokens grafted in (NGRAM_GRAFT; speclab.proposers.graft says
    how m = GRAFT_TOKENS was chosen): k becomes the verified budget."""
    return Row(r.method, r.k + m, r.tree, {**r.spec, "num_speculative_tokens": r.k + m, **NGRAM_GRAFT}, r.head,
               r.draft_dtype, m)


def rows_for(real: bool, k: int, temperature: float, draft: str, methods=None, eagle_heads=None,
             draft_dtypes=None, graft_tokens: int = GRAFT_TOKENS) -> list[Row]:
    """The rows at one k. `eagle_heads`: EAGLE heads to compare (names or directories; None: the shipped one),
    each in every EAGLE row (chain, static tree, dynamic tree). `draft_dtypes`: every model drafter's row
    once per dtype ("float32", "bfloat16": speculative_config's draft_dtype; None: the target's).
    `graft_tokens` m > 0: every tree row (EAGLE's static and dynamic trees, the draft's star) once more with an
    n-gram chain of up to m tokens grafted in (its k is then k + m, the verified budget)."""
    sample = "greedy" if temperature == 0 else "probabilistic"
    rows = [Row("none", 0, None, None),
            Row("ngram", k, None, {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3,
                                   "prompt_lookup_min": 1}),
            Row("draft_model", k, None, {"method": "draft_model", "model": draft, "num_speculative_tokens": k,
                                         "draft_sample_method": sample})]
    if real:  # the same draft over the target's 8192 most written tokens (FR-Spec; speclab.models.draft_vocab)
        rows.append(Row("draft_model", k, None, {"method": "draft_model", "model": draft, "num_speculative_tokens": k,
                                                 "draft_sample_method": sample, "draft_vocab_size": DRAFT_VOCAB}))
    heads = ("eagle",) if real else EMBEDDED_METHODS[2:]
    rows += [Row(m, k, None, {"method": m, "num_speculative_tokens": k, "draft_sample_method": sample}) for m in heads]
    trees = eagle_trees(k)
    if real:  # the draft model's star too, over its 8192-token vocabulary (its fastest chain's)
        trees.append(Row("draft_model", k, star_literal(k), {"method": "draft_model", "model": draft,
                                                             "num_speculative_tokens": k, "draft_vocab_size": DRAFT_VOCAB,
                                                             "speculative_token_tree": star_literal(k)}))
    rows += trees + ([grafted(r, graft_tokens) for r in trees] if graft_tokens else [])
    if temperature > 0:  # EAGLE's static tree and drawn tree with their children drawn from q (tree_drafting)
        for tree in dict.fromkeys([STATIC_TREES[k]] * (k in STATIC_TREES) + [drawn_tree(k)]):
            n = parse_tree(tree).num_nodes
            rows.append(Row("eagle", n, tree, {"method": "eagle", "speculative_token_tree": tree,
                                               "num_speculative_tokens": n, "draft_sample_method": "probabilistic"}))
    if eagle_heads:  # every EAGLE row once per head
        rows = [r for r in rows if r.method != "eagle"] + [
            Row(r.method, r.k, r.tree, {**r.spec, "model": h}, h, r.draft_dtype, r.graft_tokens)
            for h in eagle_heads for r in rows if r.method == "eagle"]
    if draft_dtypes:  # the model drafters once per dtype (n-gram has no weights)
        rows = [r for r in rows if r.method in ("none", "ngram")] + [
            Row(r.method, r.k, r.tree, {**r.spec, "draft_dtype": d}, r.head, d, r.graft_tokens)
            for r in rows if r.method not in ("none", "ngram") for d in draft_dtypes]
    return [r for r in rows if methods is None or r.method in methods or r.method == "none"]  # plain: the baseline


def drawn_tree(k: int) -> str:
    """The tree EAGLE drafts at T > 0 with its children drawn from q (`draft_sample_method` "probabilistic"
    with a static tree): DRAWN_ROOT_CHILDREN at the root, and under the first a chain down to depth k."""
    nodes = [(i,) for i in range(DRAWN_ROOT_CHILDREN)] + [(0,) * d for d in range(2, k + 1)]
    return "[" + ", ".join("(" + ", ".join(map(str, n)) + ("," if len(n) == 1 else "") + ")" for n in nodes) + "]"


def eagle_trees(k: int) -> list[Row]:
    """EAGLE's static tree of k nodes (when STATIC_TREES has one) and its EAGLE-2 dynamic tree of k nodes.
    Their children are the head's top-k (greedy drafts) at every temperature."""
    rows = []
    if k in STATIC_TREES:
        rows.append(Row("eagle", k, STATIC_TREES[k], {"method": "eagle", "num_speculative_tokens": k,
                                                      "speculative_token_tree": STATIC_TREES[k]}))
    steps, topk = DYNAMIC_TREES.get(k, (k - 1, 2))
    if steps > 1 or not rows:  # at one depth the dynamic tree is the static one
        rows.append(Row("eagle", k, f"dynamic: steps {steps}, topk {topk}", {
            "method": "eagle", "num_speculative_tokens": k, "speculative_num_steps": steps,
            "speculative_eagle_topk": topk, "speculative_num_draft_tokens": k + 1}))
    return rows


def rows_for_ks(real: bool, ks: list[int], temperature: float, draft: str, methods=None, eagle_heads=None,
                draft_dtypes=None, graft_tokens: int = GRAFT_TOKENS) -> list[Row]:
    """One plain row, then every k's speculative rows (`rows_for`), all measured in the same rounds."""
    return [r for i, k in enumerate(ks)
            for r in rows_for(real, k, temperature, draft, methods, eagle_heads, draft_dtypes, graft_tokens)
            if i == 0 or r.spec is not None]


def time_proposer(llm) -> dict:
    """Time the engine's proposer (`propose`, which runs a head's passes over the step's hidden states
    too): {"seconds", "drafted"} accumulate over the calls until the LLM is discarded."""
    prop, acc = llm.engine.runner.proposer, {"seconds": 0.0, "drafted": 0}
    if prop is None:
        return acc

    def on_call(seconds, _args, out):
        acc["seconds"] += seconds
        acc["drafted"] += sum(len(p.token_ids) for p in out or [])
    wrap_timed(prop, "propose", on_call)
    return acc


def time_prefill(model, max_step_tokens: int) -> dict:
    """Time the target's forwards over more than `max_step_tokens` tokens (prompt prefills: a decode or
    verify step of these batch-1 rows has at most k + 1): {"seconds"} accumulates. Rows that share
    the target's weights share its model, so one wrapper serves them all."""
    acc = {"seconds": 0.0}

    def on_call(seconds, args, _out):
        if int(args[0].numel()) > max_step_tokens:
            acc["seconds"] += seconds
    wrap_timed(model, "forward", on_call)
    return acc


def run_set(llm, prompts, temperature: float, max_tokens: int, chat: bool) -> tuple[float, list[list[int]]]:
    """(seconds, output token ids) over the prompts, one request at a time (batch 1)."""
    # a sampled answer runs to max_tokens, so each row's time per token carries the same prefill
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=not chat or temperature > 0)
    call = (lambda p: llm.chat(p, params, use_tqdm=False)) if chat else (lambda p: llm.generate([p], params, use_tqdm=False))
    secs, outs = 0.0, []
    for p in prompts:
        out, seconds = timed(lambda: call(p))
        secs += seconds
        outs.append(list(out[0].outputs[0].token_ids))
    return secs, outs


def measure(rows, prompt_sets, temperature, args, real) -> dict:
    """Interleaved rounds: (row index, set) -> {"seconds": [...], "tokens": [...], "outputs", "stats", "propose"}."""
    # batch 1: a small pool per row; every row's engine on the same stream (--seed), so at T > 0 runs with one seed
    # sample alike and repeat the timing, and another seed samples other answers
    small = dict(max_num_seqs=4, kv_cache_gb=0.25, dtype=args.dtypes[0], seed=getattr(args, "seed", 0))
    llms = [LLM(args.target, speculative_config=r.spec, **small) for r in rows]
    timers = [time_proposer(llm) for llm in llms]
    prefill = {}  # id(target model) -> its prefill timer
    for llm in llms:
        model = llm.engine.runner.model
        if id(model) not in prefill:
            prefill[id(model)] = time_prefill(model, max(r.k for r in rows) + 1)
    first = next(iter(prompt_sets.values()))[0]
    for llm in llms:  # warm-up, then counters from zero
        run_set(llm, [first], temperature, 8, real)
        llm.engine.stats.reset()
    for t in timers:
        t["seconds"], t["drafted"] = 0.0, 0
    out = {}
    for _ in range(args.repeats):
        for i, (llm, timer) in enumerate(zip(llms, timers)):
            for kind, prompts in prompt_sets.items():
                before, drafting = counters(llm.engine.stats), dict(timer)
                prefill_timer = prefill[id(llm.engine.runner.model)]
                prefill_before = prefill_timer["seconds"]
                secs, outs = run_set(llm, prompts, temperature, args.max_tokens, real)
                cell = out.setdefault((i, kind), {"seconds": [], "tokens": [], "prefill_s": [], "outputs": outs,
                                                  "drafts": 0, "drafted": 0, "accepted": 0, "per_pos": None,
                                                  "propose_s": 0.0, "proposed": 0})
                cell["seconds"].append(secs)
                cell["tokens"].append(sum(len(o) for o in outs))
                cell["prefill_s"].append(prefill_timer["seconds"] - prefill_before)
                cell["prompts"] = len(prompts)
                after = counters(llm.engine.stats)
                for j, key in enumerate(("drafts", "drafted", "accepted")):
                    cell[key] += after[j] - before[j]
                per_pos = [a - b for a, b in zip(after[3], before[3])]
                cell["per_pos"] = per_pos if cell["per_pos"] is None else [a + b for a, b in zip(cell["per_pos"], per_pos)]
                cell["propose_s"] += timer["seconds"] - drafting["seconds"]
                cell["proposed"] += timer["drafted"] - drafting["drafted"]
    return out


def counters(st) -> tuple:
    return st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens, list(st.num_accepted_tokens_per_pos)


def bench_heads(args) -> None:
    real = args.target == "smollm2"
    ks = sorted(set(args.k if isinstance(args.k, list) else [args.k]))
    sets = tuple(args.sets or (("edit", "codegen", "qa", "chat") if real else ("code", "prose")))
    prompt_sets = {kind: (load_chat_prompts(kind) if real else load_prompts(kind))[:args.num_prompts] for kind in sets}
    info = machine_info()
    dtype = args.dtypes[0]
    print(f"{args.target} in {dtype}: batch 1, k = {' '.join(map(str, ks))} (a tree: k nodes), {args.max_tokens} new "
          f"tokens, {args.num_prompts} prompts per set, {args.repeats} interleaved rounds, seed {getattr(args, 'seed', 0)}; "
          f"{info['cpu']}, {info['cores']} "
          f"cores, torch {info['torch']} with {info['threads']} thread(s); load average {info['load_average']}")
    table = []
    with shared_weights():
        plain = LLM(args.target, max_num_seqs=4, kv_cache_gb=0.25, dtype=dtype)
        graft_tokens = getattr(args, "graft_tokens", GRAFT_TOKENS)
        budgets = sorted({*ks, *(k + graft_tokens for k in ks if graft_tokens),  # a grafted row's k: tree + chain
                          *(parse_tree(drawn_tree(k)).num_nodes for k in ks if any(t > 0 for t in args.temperatures))})
        v = {k: forward_seconds(plain.model, tokens=k + 1) / forward_seconds(plain.model) for k in budgets}
        print("a (k + 1)-token target forward costs v_k decode steps (pred = tau / (v_k + k c)): "
              + ", ".join(f"v_{k} = {v[k]:.2f}" for k in budgets))
        del plain
        for temperature in args.temperatures:
            rows = rows_for_ks(real, ks, temperature, args.draft, getattr(args, "head_methods", None),
                               getattr(args, "eagle_heads", None), getattr(args, "draft_dtypes", None), graft_tokens)
            cells = measure(rows, prompt_sets, temperature, args, real)
            print(f"\n{'set':<8}{'T':>3} {'method':<12}{'k':>3} {'tree':<34}{'tok/s':>7}{'speedup':>20}{'decode':>20}"
                  f"{'pred':>7}{'c':>7}{'rate':>6}{'tau':>6} {'same':>5}  acceptance per position")
            for kind in sets:
                plain = cells[(0, kind)]
                for i, r in enumerate(rows):
                    table.append(report_row(r, kind, temperature, cells[(i, kind)], plain, v.get(r.k, 1.0)))
    best = best_rows(table)
    if len(ks) > 1:
        print_best(best)
    info["load_average_at_the_end"] = machine_info()["load_average"]
    print("\nspeedup: median tokens/s over the plain row's, same set and T (range over the rounds); decode: the "
          "same after each prompt's prefill and first token (which every row computes alike); c: drafting "
          "seconds per drafted token / plain seconds per token; rate: accepted / drafted; same: output identical to "
          f"plain greedy (T = 0). Load average at the end {info['load_average_at_the_end']}.")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "target": args.target, "dtype": dtype, "ks": ks,
                                               "max_tokens": args.max_tokens, "num_prompts": args.num_prompts,
                                               "repeats": args.repeats, "seed": getattr(args, "seed", 0), "rows": table,
                                               "best": best}, indent=1) + "\n")
        print(f"wrote {args.json}")


def best_rows(table: list[dict]) -> list[dict]:
    """The fastest configuration of each method (any k, tree or draft vocabulary) per set and temperature:
    the row with the highest median speedup. A maximum over noisy rows leans high: read its range too."""
    best = {}
    for r in table:
        if r["method"] == "none":
            continue
        # best over k, trees, vocabularies, draft dtypes; a drafter with a grafted lookup apart from it alone
        key = (r["set"], r["temperature"], r["method"], r.get("head"), r.get("graft_method"))
        if key not in best or r["speedup"] > best[key]["speedup"]:
            best[key] = r
    return [{k: r.get(k) for k in ("set", "temperature", "method", "head", "k", "tree", "draft_sample_method",
                                   "draft_vocab_size", "draft_dtype",
                                   "graft_method", "graft_tokens", "speedup", "speedup_range", "decode_speedup",
                                   "mean_acceptance_length", "identical")}
            for r in best.values()]


def print_best(best: list[dict]) -> None:
    print("\nbest configuration per method (highest median speedup over k, trees, draft vocabularies and dtypes):")
    for b in best:
        how = (b["tree"] or ("chain" + (f", vocab {b['draft_vocab_size']}" if b["draft_vocab_size"] else ""))) \
            + (", drawn" if b["tree"] and b.get("draft_sample_method") == "probabilistic" else "") \
            + (f", head {Path(b['head']).name}" if b.get("head") else "") \
            + (f", {b['draft_dtype']} draft" if b.get("draft_dtype") else "") \
            + (f" + {b['graft_method']} {b['graft_tokens']}" if b.get("graft_method") else "")
        same = "" if b["identical"] is None else ("identical" if b["identical"] else "NOT identical")
        print(f"  {b['set']:<8}T = {b['temperature']:g}  {b['method']:<12} k = {b['k']:<3}{how:<34} "
              f"{b['speedup']:.2f}x ({b['speedup_range'][0]:.2f}-{b['speedup_range'][1]:.2f}), decode "
              f"{b['decode_speedup']:.2f}x, tau {b['mean_acceptance_length']:.2f}  {same}")


def report_row(r: Row, kind: str, temperature: float, cell: dict, plain: dict, v_k: float) -> dict:
    """Print one line of the table; return its JSON row."""
    per_token = [s / n for s, n in zip(cell["seconds"], cell["tokens"])]
    base = [s / n for s, n in zip(plain["seconds"], plain["tokens"])]
    ratios = [b / t for b, t in zip(base, per_token)]

    def decode_per_token(c):  # after each prompt's prefill and the first token it gives
        return [(s - p) / max(n - c["prompts"], 1) for s, p, n in zip(c["seconds"], c["prefill_s"], c["tokens"])]
    decode_ratios = [b / t for b, t in zip(decode_per_token(plain), decode_per_token(cell))]
    spec, drafts = r.spec is not None, max(cell["drafts"], 1)
    c = cell["propose_s"] / max(cell["proposed"], 1) / statistics.median(base) if spec else 0.0
    tau = 1 + cell["accepted"] / drafts if spec else 1.0
    identical = cell["outputs"] == plain["outputs"] if temperature == 0 else None
    vocab = (r.spec or {}).get("draft_vocab_size")
    row = {"set": kind, "temperature": temperature, "method": r.method, "head": r.head, "k": r.k, "tree": r.tree,
           "draft_sample_method": (r.spec or {}).get("draft_sample_method"),
           "draft_vocab_size": vocab, "draft_dtype": r.draft_dtype,
           "graft_method": (r.spec or {}).get("graft_method"), "graft_tokens": r.graft_tokens,
           "tok_per_s": 1 / statistics.median(per_token), "speedup": statistics.median(ratios),
           "speedup_range": [min(ratios), max(ratios)],
           "decode_speedup": statistics.median(decode_ratios),
           "decode_speedup_range": [min(decode_ratios), max(decode_ratios)],
           "prefill_share": statistics.median(p / s for p, s in zip(cell["prefill_s"], cell["seconds"])),
           "acceptance_rate": cell["accepted"] / max(cell["drafted"], 1) if spec else None,
           "mean_acceptance_length": tau,
           "acceptance_per_position": [a / drafts for a in cell["per_pos"]] if spec else [],
           "c": c, "predicted_speedup": tau / (v_k + r.k * c) if spec else 1.0, "identical": identical}
    per_pos = " ".join(f"{a:.2f}" for a in row["acceptance_per_position"][:r.k])
    speed = f"{row['speedup']:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    decode = f"{row['decode_speedup']:.2f}x ({min(decode_ratios):.2f}-{max(decode_ratios):.2f})"
    same = "" if identical is None else ("yes" if identical else "NO")
    label = (r.tree or ("chain" + (f", vocab {vocab}" if vocab else ""))) if spec else ""
    label += ", drawn" if r.tree and (r.spec or {}).get("draft_sample_method") == "probabilistic" else ""
    label += f", head {Path(r.head).name}" if r.head else ""
    label += f", {r.draft_dtype} draft" if r.draft_dtype else ""
    label += f" + ngram {r.graft_tokens}" if r.graft_tokens else ""
    print(f"{kind:<8}{temperature:>3g} {r.method:<12}{r.k:>3} {label:<34}{row['tok_per_s']:>7.1f}{speed:>20}{decode:>20}"
          f"{row['predicted_speedup']:>6.2f}x{c:>7.3f}{(row['acceptance_rate'] or 0):>6.2f}{tau:>6.2f} {same:>5}  "
          f"{per_pos}", flush=True)
    return row
