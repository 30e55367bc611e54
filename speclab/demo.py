"""The README's first command: `make demo` (python -m speclab.demo).

For now it runs lesson 02's speculative loop on a pair of toy Markov language models whose
distributions are known exactly, and prints what the course is about: speculation emits
several tokens per target call, matches the theory, and leaves the output distribution
unchanged. (The engine issues turn this into a demo on the embedded transformer pair.)
"""

import argparse
import torch

from speclab import stats
from speclab.metrics import SpecDecodingStats
from speclab.reference import autoregressive_generate, speculative_generate
from speclab.toy import MarkovLM


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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


if __name__ == "__main__":
    main()
