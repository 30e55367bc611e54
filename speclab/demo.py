"""The README's first command: `make demo` (python -m speclab.demo).

The embedded target generates Python code three ways on held-out prompts, at batch 1 and greedy:
without speculation, with n-gram (prompt lookup) drafts, and with the embedded draft model. For
each it prints tokens/s, acceptance rate, mean acceptance length, the speedup over plain decoding
measured in the same run, and whether the output is token-for-token identical to plain decoding
(it must be: greedy speculation is exact). It saves a plot to figures/demo.png.

`python -m speclab.demo --toy` runs lesson 02's loop on toy Markov models instead, where the
exact output distribution is known and checked.
"""

import argparse
import statistics

import torch

from speclab import stats
from speclab.metrics import SpecDecodingStats
from speclab.reference import autoregressive_generate, speculative_generate
from speclab.toy import MarkovLM


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
    import os
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores; torch {torch.__version__} with {threads} thread(s)"


def speedup_text(ratios: list[float]) -> str:
    """The median speedup with its range over the repeats; a speedup whose repeats disagree on
    which side of 1.0 it lies was not reproduced, and is not printed as one."""
    lo, mid, hi = min(ratios), statistics.median(ratios), max(ratios)
    if lo < 1.0 < hi:
        return f"not reproduced ({lo:.2f}-{hi:.2f}x)"
    return f"{mid:.2f}x ({lo:.2f}-{hi:.2f})"


def real_demo(num_prompts: int = 6, max_tokens: int = 64, k: int = 4, repeats: int = 3, threads: int = 1) -> None:
    from speclab.bench import run_speclab
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
        outs, secs = zip(*(run_speclab(llm, [p], params) for p in sets[kind]))
        tokens = [o[0] for o in outs]
        return tokens, sum(map(len, tokens)) / sum(secs)

    print(f"embedded target, greedy, batch 1, {num_prompts} held-out prompts per row, {max_tokens} new tokens each;\n"
          f"each row repeated {repeats} times, interleaved with plain decoding of the same prompts "
          f"(median and range)\nmachine: {machine_line(threads)}\n")
    print(f"{'method':<18}{'prompts':<8}{'tok/s':>8}{'speedup':>24}{'accept rate':>13}{'mean accept len':>17}"
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
            print(f"{'no speculation':<18}{kind:<8}{statistics.median(plain_tps):>8.1f}{'1.00x':>24}{'-':>13}"
                  f"{'1.00':>17}{'True':>20}")
        print(f"{name:<18}{kind:<8}{statistics.median(spec_tps):>8.1f}{speedup_text(ratios):>24}"
              f"{m.acceptance_rate:>13.2f}{m.mean_acceptance_length:>17.2f}{str(same):>20}")
        results.append((f"{name}\n({kind} prompts)", statistics.median(ratios), m.acceptance_per_pos()))
    print("\nspeedup: tokens/s over plain decoding of the same prompts, per repeat; 'not reproduced' when the repeats "
          "disagree on whether speculation helped.\nOn this 10M-parameter target a forward is so cheap that "
          "Python overhead weighs as much as the model: lessons 03-04 show the time breakdown.")
    save_plot([("no speculation", 1.0, [])] + results)


def save_plot(results, path="figures/demo.png") -> None:
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar([r[0] for r in results], [r[1] for r in results], color=["0.6", "tab:blue", "tab:orange"])
    a.axhline(1, c="k", lw=0.8)
    a.set_ylabel("speedup over plain decoding")
    for name, _, per_pos in results[1:]:
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
    ap = argparse.ArgumentParser(description="speculative decoding on the embedded pair")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (pinned; default 1)")
    ap.add_argument("--repeats", type=int, default=3, help="times each row is measured")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    real_demo(args.num_prompts, args.max_tokens, repeats=args.repeats, threads=args.threads)


if __name__ == "__main__":
    main()
