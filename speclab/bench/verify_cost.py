"""`python -m speclab.bench verify-cost [--target smollm2] [--json PATH]`: what verifying k drafts costs.

A speculative step pays one target forward over k + 1 tokens instead of one over 1 token. If that
forward were purely memory-bound (every weight read once, whatever the number of tokens) it would
cost 1.0 decode step for any small k, and speculation would pay whenever a draft is accepted at all
(lesson 02's break-even). This benchmark measures the real cost here, for n = 1 ... 9 new tokens over
`--context` cached ones (batch 1, logits of every row included, as verification needs them):

    v_n = t(n) / t(1), in decode steps (median over interleaved rounds, with the range),

and how close the decode step comes to the memory roofline (weight bytes / t(1) / read bandwidth,
the bandwidth measured in the same run: `speclab.roofline`). Then a phase profile of the n = 1 and
n = k + 1 forwards: the projections (fused q/k/v, o, gate/up, down: `PackedLinear`), attention over
the paged cache, the output head (logits), the rest of the layers (norms, RoPE, residuals, the cache
writes, Python), and after the forward, probabilities (`logits_to_probs` on the n rows) and
verification (`rejection_sample`). Each float dtype in `--dtypes` runs in turn (float32 is the
exact reference; bfloat16 pays only on a CPU with AVX512-BF16 or AMX, which this one may lack).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path

import torch

from speclab import roofline
from speclab.engine.batch import flatten
from speclab.kv_cache import KVCacheManager
from speclab.llm import resolve_dtype
from speclab.models import cpu_decoder
from speclab.models import llama as llama_module
from speclab.models.hub import model_directory
from speclab.models.llama import load_llama
from speclab.models.packed_linear import PackedLinear
from speclab.sampling import logits_to_probs
from speclab.timing import machine_info
from speclab.verify import rejection_sample


def forward_batch(model, context: int, tokens: int, seed: int = 0):
    """(input batch, caches) for one batch-1 forward of `tokens` new tokens over `context` cached ones."""
    kv = KVCacheManager((context + tokens) // 16 + 2, 16)
    caches = model.allocate_kv_cache(kv.pool.num_blocks, 16)
    kv.allocate("r", 0, context + tokens)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (context + tokens,), generator=g).tolist()
    model(*flatten(kv, [("r", ids[:context], 0)]), caches)
    return flatten(kv, [("r", ids[context:], context)]), caches


def run_forward(model, batch, caches) -> torch.Tensor:
    return model.compute_logits(model(*batch, caches)[0])


def cost_table(model, context: int, max_new: int, rounds: int, calls: int, modules=()) -> dict:
    """n -> seconds of a forward over n new tokens, one median of `calls` calls per round, the n
    interleaved within each round (load drifts on a shared CPU fall on every n alike). For each n in
    `modules`, ("modules", n) -> the same forward with its layers run module by module (the path
    without `model.decoder_plan`, speclab.models.cpu_decoder), in the same rounds."""
    batches = {n: forward_batch(model, context, n) for n in range(1, max_new + 1)}
    keys = [*batches, *(("modules", n) for n in modules if model.decoder_plan is not None)]
    for n, (b, c) in batches.items():  # warm-up
        run_forward(model, b, c)
    out = {key: [] for key in keys}
    plan = model.decoder_plan
    for _ in range(rounds):
        for key in keys:
            b, c = batches[key[1] if isinstance(key, tuple) else key]
            model.decoder_plan = None if isinstance(key, tuple) else plan
            times = []
            try:
                for _ in range(calls):
                    t0 = time.perf_counter()
                    run_forward(model, b, c)
                    times.append(time.perf_counter() - t0)
            finally:
                model.decoder_plan = plan
            out[key].append(statistics.median(times))
    return out


class PhaseTimer:
    """Seconds spent in the projections, attention and the output head, by wrapping them for the
    duration of a `with` block (a few hundred ns per call of overhead, against tens of µs per call).
    Where the layers run as one native call (`model.decoder_plan`, speclab.models.cpu_decoder), that
    call times its own projections and attention and the wrappers see only the output head."""

    def __init__(self, model):
        self.head, self.plan = model.head, model.decoder_plan  # the head's PackedLinear: its time is "logits"
        self.seconds = {"projections": 0.0, "attention": 0.0, "logits": 0.0}

    def __enter__(self):
        self._call, self._attn = PackedLinear.__call__, llama_module.paged_attention
        timer = self

        def timed_call(linear, x):
            t0 = time.perf_counter()
            out = timer._call(linear, x)
            timer.seconds["logits" if linear is timer.head else "projections"] += time.perf_counter() - t0
            return out

        def timed_attn(*args):
            t0 = time.perf_counter()
            out = timer._attn(*args)
            timer.seconds["attention"] += time.perf_counter() - t0
            return out
        PackedLinear.__call__, llama_module.paged_attention = timed_call, timed_attn
        if self.plan is not None:
            self.plan.seconds = (ctypes.c_double * len(cpu_decoder.PHASES))()
        return self

    def __exit__(self, *exc):
        PackedLinear.__call__, llama_module.paged_attention = self._call, self._attn
        if self.plan is not None:
            native = dict(zip(cpu_decoder.PHASES, self.plan.seconds))
            self.seconds["projections"] += native["projections"]
            self.seconds["attention"] += native["attention"]
            self.plan.seconds = None


def phase_profile(model, context: int, n: int, calls: int) -> dict[str, float]:
    """Milliseconds per phase of one forward over n tokens and of its verification (medians of `calls`)."""
    batch, caches = forward_batch(model, context, n)
    run_forward(model, batch, caches)
    per_call = []
    for _ in range(calls):
        with PhaseTimer(model) as timer:
            t0 = time.perf_counter()
            logits = run_forward(model, batch, caches)
            total = time.perf_counter() - t0
        t1 = time.perf_counter()
        probs = logits_to_probs(logits, torch.ones(n), torch.zeros(n, dtype=torch.long), torch.ones(n))
        t2 = time.perf_counter()
        drafts = probs[:-1].argmax(-1) if n > 1 else torch.zeros(0, dtype=torch.long)
        rejection_sample(drafts, [n - 1], probs, None, generator=torch.Generator().manual_seed(0))
        t3 = time.perf_counter()
        s = timer.seconds
        per_call.append({"projections": s["projections"], "attention": s["attention"], "logits": s["logits"],
                         "rest of the layers": total - sum(s.values()), "forward": total,
                         "probabilities": t2 - t1, "verification": t3 - t2})
    return {key: 1e3 * statistics.median(c[key] for c in per_call) for key in per_call[0]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="target", help="'target' (embedded), 'smollm2', or a checkpoint directory")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--context", type=int, default=128, help="tokens already in the cache")
    ap.add_argument("--max-new", type=int, default=9, help="largest forward measured (k + 1)")
    ap.add_argument("--k", type=int, default=4, help="the phase profile's verification forward is k + 1 tokens")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--calls", type=int, default=5, help="forwards per n and round (their median)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    print(f"verify-cost: {args.target}, batch 1, {args.context} cached tokens, forwards over 1..{args.max_new} new "
          f"tokens with their logits; {args.rounds} interleaved rounds x median of {args.calls}; {info['cpu']}, "
          f"{info['cores']} cores, torch {info['torch']}, {args.threads} thread(s); load average {info['load_average']}")
    report = {"machine": info, "target": args.target, "context": args.context, "dtypes": {}}
    for dtype in args.dtypes:
        path = model_directory(args.target)
        model = load_llama(path, dtype=resolve_dtype(dtype, path))
        bandwidth = [roofline.read_bandwidth()]
        costs = cost_table(model, args.context, args.max_new, args.rounds, args.calls, modules=(1, args.k + 1))
        bandwidth.append(roofline.read_bandwidth())
        bw = statistics.median(bandwidth)
        nbytes = roofline.weight_bytes_per_token(model)
        t1 = statistics.median(costs[1])
        fraction = nbytes / t1 / bw
        print(f"\n{dtype}: weights {nbytes / 1e6:.0f} MB per decode step; read bandwidth {bw / 1e9:.1f} GB/s "
              f"(torch sum, range {min(bandwidth) / 1e9:.1f}-{max(bandwidth) / 1e9:.1f}); decode step {1e3 * t1:.1f} ms "
              f"= {fraction:.0%} of the roofline")
        print(f"{'n':>3}{'ms':>9}{'decode steps':>24}")
        rows, modules = [], []
        for n, secs in costs.items():
            if isinstance(n, tuple):
                ratios = [m / s for m, s in zip(secs, costs[n[1]])]
                modules.append({"tokens": n[1], "ms": 1e3 * statistics.median(secs),
                                "versus_one_call": statistics.median(ratios), "range": [min(ratios), max(ratios)]})
                continue
            ratios = [s / b for s, b in zip(secs, costs[1])]
            rows.append({"tokens": n, "ms": 1e3 * statistics.median(secs), "decode_steps": statistics.median(ratios),
                         "decode_steps_range": [min(ratios), max(ratios)]})
            print(f"{n:>3}{rows[-1]['ms']:>9.2f}{rows[-1]['decode_steps']:>12.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        if modules:
            print(f"layers module by module ({cpu_decoder.SWITCH}=0), in the same rounds:")
        else:
            print(f"(the layers ran module by module: {model.decoder_why})")
        for m in modules:
            print(f"{m['tokens']:>3}{m['ms']:>9.2f} ms, {m['versus_one_call']:.2f}x ({m['range'][0]:.2f}-"
                  f"{m['range'][1]:.2f}) the time of the one native call")
        phases = {n: phase_profile(model, args.context, n, args.calls) for n in (1, args.k + 1)}
        print(f"\nphase profile, ms per forward (median of {args.calls}): n = 1 | n = {args.k + 1}")
        for key in phases[1]:
            print(f"  {key:<20}{phases[1][key]:>8.2f} | {phases[args.k + 1][key]:>8.2f}")
        report["dtypes"][dtype] = {"weight_bytes": nbytes, "read_bandwidth": bw, "decode_ms": 1e3 * t1,
                                   "roofline_fraction": fraction, "rows": rows,
                                   "layers_module_by_module": modules,
                                   "phases_ms": {str(n): p for n, p in phases.items()}}
        del model
    report["machine"]["load_average_at_the_end"] = machine_info()["load_average"]
    print(f"\nload average at the end {report['machine']['load_average_at_the_end']}; compare rows of one run.")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
