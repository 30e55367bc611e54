"""`python -m speclab.bench WHICH`: the benchmarks' command line, and the decode / spec / roofline / ngram tables.

    python -m speclab.bench decode     # plain decoding: speclab vs transformers at batch 1, 8, 32
    python -m speclab.bench spec       # speculative decoding at batch 1: speclab vs transformers
    python -m speclab.bench roofline   # batch-1 decode against this machine's memory bandwidth
    python -m speclab.bench ngram      # microseconds per n-gram proposal at 1K and 8K tokens of context
    python -m speclab.bench all --target smollm2   # decode, roofline, spec on the real model
    python -m speclab.bench heads      # every proposer side by side, heads included (lesson 08; heads.py)
    python -m speclab.bench vs-vllm    # speclab, real vLLM and transformers side by side (vs_vllm.py)
    python -m speclab.bench verify-cost  # a forward over 1..9 tokens in decode steps, phase by phase (verify_cost.py)
    python -m speclab.bench attention  # forwards with the paged CPU attention kernel vs gather + SDPA (attention.py)
    python -m speclab.bench gemm       # a forward's projections, float32 and bfloat16, kernel vs torch's paths (gemm.py)
    python -m speclab.bench serve-vs-vllm   # speclab serve and vllm serve under both serving benchmarks

The embedded pair (default) runs on the held-out code sets of speclab/data; `--target smollm2`
(SmolLM2-135M-Instruct, Q4_1-dequantized) runs on the held-out chat sets (edit, codegen, qa, chat)
through the chat template, with the distilled draft "smollm2-draft" (or `--draft PATH`). Both sides
get the same token ids, checkpoint, dtype, thread count and number of new tokens (end tokens are
ignored). Every table warms up first. Wall-clock numbers on a shared CPU are noisy: compare rows
of the same run, and rerun before believing a difference under ~10%.
"""

import argparse
import copy
import statistics
import sys

import torch

from speclab import roofline, stats
from speclab.bench.attention import main as attention_main
from speclab.bench.gemm import main as gemm_main
from speclab.bench.heads import bench_heads
from speclab.bench.prompts import REAL_SETS, find_draft, is_real, prompt_ids
from speclab.bench.serve_vs_vllm import main as serve_vs_vllm_main
from speclab.bench.verify_cost import main as verify_cost_main
from speclab.bench.vs_vllm import main as vs_vllm_main
from speclab.llm import LLM, resolve_dtype
from speclab.models.heads.config import HEAD_METHODS
from speclab.models.hub import model_directory
from speclab.models.llama import load_llama
from speclab.proposers.graft import GRAFT_TOKENS
from speclab.sampling_params import SamplingParams
from speclab.spec_config import DRAFT_DTYPES
from speclab.timing import forward_seconds, median_seconds, timed


def run_speclab(llm: LLM, prompts, params: SamplingParams) -> tuple[list[list[int]], float]:
    """(generated token ids per prompt, seconds) for one batched generate call; prompts: strings or id lists."""
    prompts = [p if isinstance(p, str) else {"prompt_token_ids": p} for p in prompts]
    outs, seconds = timed(lambda: llm.generate(prompts, params, use_tqdm=False))
    return [o.outputs[0].token_ids for o in outs], seconds


def run_hf(model, tokenizer, prompts, max_new_tokens: int, greedy: bool, **kwargs):
    """(generated ids per prompt, seconds) for transformers' generate on one left-padded batch;
    prompts: strings or token id lists."""
    ids = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(map(len, ids))
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    sampling = {} if greedy else dict(temperature=1.0, top_k=0, top_p=1.0)
    # eos_token_id = an id no token has: generate neither stops at the model's end token nor masks it
    # (min_new_tokens would), which is what speclab's ignore_eos does
    with torch.inference_mode():
        out, seconds = timed(lambda: model.generate(
            input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
            eos_token_id=model.config.vocab_size, do_sample=not greedy, pad_token_id=pad, **sampling, **kwargs))
    return [row[width:].tolist() for row in out], seconds


def interleaved(sides: dict, repeats: int) -> dict[str, list]:
    """Run each side's callable `repeats` times, alternating the sides (one round: each side once), so
    that drifting load on a shared CPU falls on all of them alike. Returns side -> its results in order."""
    out = {name: [] for name in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            out[name].append(fn())
    return out


def median_range(values) -> str:
    """'median (min-max)' of ratios, for the tables."""
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def bench_decode(args) -> None:
    """Plain decoding tokens/s: speclab's engine against transformers' generate, same checkpoint and dtype,
    `--repeats` interleaved rounds per row (medians; the ratio's range over the rounds)."""
    from speclab.models.hub import load_model, load_tokenizer

    tok = load_tokenizer(args.target)
    prompts = prompt_ids(tok, args.target, "codegen" if is_real(args.target) else "code")
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"plain greedy decoding, {args.max_tokens} new tokens per prompt, torch threads = {torch.get_num_threads()}, "
          f"{args.repeats} interleaved rounds per row")
    print(f"{'dtype':<9}{'batch':>5} {'speclab tok/s':>14} {'transformers tok/s':>19} {'ratio (range)':>20} "
          f"{'same tokens':>12}")
    for dtype in args.dtypes:
        torch_dtype = resolve_dtype(dtype, model_directory(args.target))
        llm, hf = LLM(args.target, max_num_seqs=64, dtype=torch_dtype), load_model(args.target, dtype=torch_dtype)
        run_speclab(llm, prompts[:2], params)  # warm-up
        run_hf(hf, tok, prompts[:2], 8, greedy=True)
        for bs in args.batch_sizes:
            batch = (prompts * (bs // len(prompts) + 1))[:bs]
            runs = interleaved({"ours": lambda: run_speclab(llm, batch, params),
                                "hf": lambda: run_hf(hf, tok, batch, args.max_tokens, greedy=True)}, args.repeats)
            (ours, _), (theirs, _) = runs["ours"][0], runs["hf"][0]
            t_ours = statistics.median(t for _, t in runs["ours"])
            t_hf = statistics.median(t for _, t in runs["hf"])
            ratios = [h / o for (_, o), (_, h) in zip(runs["ours"], runs["hf"])]
            n = sum(map(len, ours))
            same = sum(a == b for a, b in zip(ours, theirs))
            print(f"{dtype:<9}{bs:>5} {n / t_ours:>14.1f} {n / t_hf:>19.1f} {median_range(ratios):>20} "
                  f"{same:>7}/{bs}", flush=True)
        del llm, hf
    print("ratio: speclab tokens/s over transformers', per round of this run (prefill included), median and range; "
          "same tokens: prompts whose greedy output is identical token for token.")


def decode_rate(generate, n: int, repeat: int = 5) -> float:
    """Decode tokens/s without the prefill: the median over `repeat` back-to-back pairs of
    (n - 1) / (t(n tokens) - t(1 token)); a pair shares the machine's load, which drifts on a shared CPU."""
    generate(n)  # warm-up
    rates = []
    for _ in range(repeat):
        t_n, t_1 = timed(lambda: generate(n))[1], timed(lambda: generate(1))[1]
        rates.append((n - 1) / (t_n - t_1) if t_n > t_1 else float("inf"))
    return statistics.median(rates)


def bench_roofline(args) -> None:
    """Batch 1, greedy: weight bytes read per second against this machine's read bandwidth."""
    from speclab.models.hub import load_model, load_tokenizer

    tok = load_tokenizer(args.target)
    prompt = prompt_ids(tok, args.target, "codegen" if is_real(args.target) else "code")[0]
    n = args.max_tokens
    bandwidths = [roofline.read_bandwidth()]
    print(f"roofline at batch 1: decode tokens/s = (n - 1) / (t(n) - t(1)), median of 5 pairs, n = {n}, one "
          f"{len(prompt)}-token prompt; "
          f"torch threads = {torch.get_num_threads()}")
    rows = []
    for dtype in args.dtypes:
        torch_dtype = resolve_dtype(dtype, model_directory(args.target))
        llm, hf = LLM(args.target, max_num_seqs=1, dtype=torch_dtype), load_model(args.target, dtype=torch_dtype)
        ours = decode_rate(lambda m: run_speclab(llm, [prompt], SamplingParams(temperature=0, max_tokens=m,
                                                                                ignore_eos=True)), n)
        theirs = decode_rate(lambda m: run_hf(hf, tok, [prompt], m, greedy=True), n)
        rows.append((dtype, roofline.weight_bytes_per_token(llm.model), ours, theirs))
        bandwidths.append(roofline.read_bandwidth())
        del llm, hf
    bw = sorted(bandwidths)[len(bandwidths) // 2]
    print(f"read bandwidth (torch sum over 512 MB, median of {len(bandwidths)} measurements in this run): "
          f"{bw / 1e9:.1f} GB/s (range {min(bandwidths) / 1e9:.1f}-{max(bandwidths) / 1e9:.1f})")
    print(f"{'dtype':<9}{'weights/token':>14}{'speclab tok/s':>14}{'GB/s':>7}{'roofline':>9}"
          f"{'HF tok/s':>10}{'HF GB/s':>8}{'HF roofline':>12}{'ratio':>7}")
    for dtype, nbytes, ours, theirs in rows:
        print(f"{dtype:<9}{nbytes / 1e6:>11.0f} MB{ours:>14.1f}{ours * nbytes / 1e9:>7.1f}"
              f"{roofline.roofline_fraction(ours, nbytes, bw):>8.0%}{theirs:>10.1f}{theirs * nbytes / 1e9:>8.1f}"
              f"{roofline.roofline_fraction(theirs, nbytes, bw):>11.0%}{ours / theirs:>6.2f}x")
    print("roofline: weight bytes per token x tokens/s / read bandwidth (the KV cache read, ~1% here, left out).")


def spec_rows(args, draft: str | None) -> list[tuple[str, str, int]]:
    """(prompt set, method, k) rows: plain and n-gram on every set, the draft where it exists."""
    sets = args.sets or (REAL_SETS if is_real(args.target) else ("code", "copy", "prose"))
    rows = [(s, "none", 0) for s in sets] + [(s, "ngram", args.ngram_k) for s in sets]
    if args.methods:
        rows = [r for r in rows if r[1] in args.methods or r[1] == "none"]
    if draft is None or (args.methods and "draft_model" not in args.methods):
        return rows
    draft_sets = sets if is_real(args.target) or args.sets else ("code",)
    return rows + [(s, "draft_model", k) for k in args.ks for s in draft_sets]


def spec_config(method: str, k: int, draft, greedy: bool) -> dict | None:
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k,
            "draft_sample_method": "greedy" if greedy else "probabilistic"}


def bench_spec(args) -> None:
    """Speculative decoding at batch 1: speclab's proposers against transformers' assisted generation."""
    from speclab.models.hub import load_model, load_tokenizer

    dtype = resolve_dtype(args.dtypes[0], model_directory(args.target))
    tok, target_hf = load_tokenizer(args.target), load_model(args.target, dtype=dtype)
    draft = find_draft(args.draft)
    target = load_llama(model_directory(args.target), dtype=dtype)
    t1 = forward_seconds(target)
    ks = sorted(set(args.ks) | {args.ngram_k})
    verify_cost = {k: forward_seconds(target, tokens=k + 1) / t1 for k in ks}
    c = forward_seconds(load_llama(draft, dtype=dtype)) / t1 if draft else 0.0
    draft_hf = load_model(draft, dtype=dtype) if draft else None
    del target
    print(f"batch 1, {args.max_tokens} new tokens, {args.num_prompts} prompts per set, {dtype}; torch threads = "
          f"{torch.get_num_threads()}\n" + (f"draft {draft}: measured c = {c:.3f} (draft/target decode step)" if draft else
          f"draft rows skipped: no draft model {args.draft!r} here (the distilled draft resolves as 'smollm2-draft' "
          f"once built; or pass --draft PATH to an HF Llama directory sharing the target's tokenizer)") +
          f"\na target forward over k + 1 tokens costs {', '.join(f'{v:.2f}' for v in verify_cost.values())} "
          f"decode steps (k = {', '.join(map(str, ks))})")
    header = (f"{'set':<8}{'T':>3} {'method':<16}{'tok/s':>7}{'speedup':>8}{'pred':>6}{'pred2':>6}{'accept':>7}"
              f"{'alpha':>6}{'mean len':>9}{'HF tok/s':>9}{'HF spd':>7}{'vs HF':>7}")
    rows = spec_rows(args, draft)
    for temperature in args.temperatures:
        greedy = temperature == 0
        print("\n" + header, flush=True)
        base = {}
        for method in dict.fromkeys(m for _, m, _ in rows):
            for k in dict.fromkeys(k for _, m, k in rows if m == method):
                llm = LLM(args.target, dtype=dtype, speculative_config=spec_config(method, k, draft, greedy))
                for kind in [s for s, m, kk in rows if m == method and kk == k]:
                    prompts = prompt_ids(tok, args.target, kind)[:args.num_prompts]
                    speed, hf_speed, m = spec_row(args, llm, target_hf, draft_hf, tok, prompts, method, k, temperature)
                    if method == "none":
                        base[kind] = (speed, hf_speed)
                    ck = c if method == "draft_model" else 0.0
                    pred = stats.speedup(m.alpha, k, ck) if k else 1.0
                    # the same with the measured cost of verifying k + 1 tokens instead of the memory-bound 1
                    pred2 = stats.expected_tokens(m.alpha, k) / (k * ck + verify_cost[k]) if k else 1.0
                    print(f"{kind:<8}{temperature:>3g} {method + (f' k={k}' if k else ''):<16}{speed:>7.1f}"
                          f"{speed / base[kind][0]:>7.2f}x{pred:>5.2f}x{pred2:>5.2f}x{m.acceptance_rate:>7.2f}"
                          f"{m.alpha:>6.2f}{m.mean_acceptance_length:>9.2f}{hf_speed:>9.1f}"
                          f"{hf_speed / base[kind][1]:>6.2f}x{speed / hf_speed:>6.2f}x", flush=True)
                del llm
    print("\nspeedup: tokens/s over plain decoding of the same set and temperature, measured in this run; pred: "
          "Leviathan's (1 - a^(k+1)) / ((1 - a)(k c + 1)) at the measured alpha and c (c = 0 for n-gram);\n"
          "pred2: the same with the measured cost of a (k + 1)-token target forward in place of 1 (the gap left "
          "to pred2 is the engine's per-step overhead); vs HF: speclab tokens/s over transformers' on the row;\n"
          "HF: transformers generate, plain / assistant_model (the same draft, k drafts, constant schedule, "
          "threshold 0) / prompt_lookup_num_tokens = k (max_matching_ngram_size 3), on the same checkpoints.")


def spec_row(args, llm, target_hf, draft_hf, tok, prompts, method, k, temperature):
    """(speclab tok/s, transformers tok/s, speclab's counters) over `prompts`, one at a time."""
    # no per-request seed: T = 1 rows measure Leviathan's rule (a seeded request is verified
    # against position-keyed samples instead; see speclab/engine/model_runner.py)
    params = SamplingParams(temperature=temperature, max_tokens=args.max_tokens, ignore_eos=True)
    run_speclab(llm, prompts[:1], SamplingParams(temperature=temperature, max_tokens=8, ignore_eos=True))
    llm.engine.stats.reset()  # count the measured run only
    tokens, secs = 0, 0.0
    for prompt in prompts:  # batch 1: one request at a time
        out, t = run_speclab(llm, [prompt], params)
        tokens, secs = tokens + len(out[0]), secs + t
    hf_kwargs = hf_assist(method, k, draft_hf)
    run_hf(target_hf, tok, prompts[:1], 8, temperature == 0, **hf_kwargs)  # warm-up
    hf_tokens, hf_secs = 0, 0.0
    for prompt in prompts:
        out, t = run_hf(target_hf, tok, [prompt], args.max_tokens, temperature == 0, **hf_assist(method, k, draft_hf))
        hf_tokens, hf_secs = hf_tokens + len(out[0]), hf_secs + t
    return tokens / secs, hf_tokens / hf_secs, llm.engine.stats


def hf_assist(method: str, k: int, draft_hf) -> dict:
    """transformers' generate kwargs for the same speculation, configured fairly."""
    if method == "ngram":
        return dict(prompt_lookup_num_tokens=k, max_matching_ngram_size=3)
    if method == "draft_model":
        assistant = copy.deepcopy(draft_hf)  # the heuristic schedule mutates the assistant's config
        assistant.generation_config.num_assistant_tokens = k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        return dict(assistant_model=assistant)
    return {}


def bench_ngram(args) -> None:
    """Microseconds per NgramProposer call (k = 5, n in [2, 4]) on random and repetitive contexts."""
    import numpy as np

    from speclab.proposers.ngram import NgramProposer

    proposer = NgramProposer(2, 4, 5)
    rng = np.random.default_rng(0)
    print(f"{'context':>8} {'kind':<12}{'from list (us)':>16}{'from array (us)':>17}")
    for L in (1024, 8192):
        for kind, tokens in [("random", rng.integers(0, 4096, L)), ("repetitive", np.tile(rng.integers(0, 4096, 64), L // 64))]:
            as_list = tokens.tolist()
            row = []
            for ctx in (as_list, tokens):
                row.append(median_seconds(lambda: proposer.propose_tokens(ctx), repeat=200) * 1e6)
            print(f"{L:>8} {kind:<12}{row[0]:>16.1f}{row[1]:>17.1f}")


def bench_all(args) -> None:
    for name, fn in (("decode", bench_decode), ("roofline", bench_roofline), ("spec", bench_spec)):
        print(f"\n=== {name} ===")
        fn(args)


# benchmarks with their own flags: name -> main(argv)
OWN_FLAGS = {"vs-vllm": vs_vllm_main, "verify-cost": verify_cost_main, "serve-vs-vllm": serve_vs_vllm_main,
             "attention": attention_main, "gemm": gemm_main}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in OWN_FLAGS:
        return OWN_FLAGS[argv[0]](argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=["decode", "spec", "roofline", "ngram", "heads", "all"])
    ap.add_argument("--target", default="target", help="'target' (embedded), 'smollm2', or a checkpoint directory")
    ap.add_argument("--draft", default=None, help="draft for the spec rows (default: 'draft', or 'smollm2-draft' "
                                                  "for smollm2); rows are skipped with a note when it is absent")
    ap.add_argument("--dtypes", nargs="+", default=None, choices=["float32", "bfloat16", "float16", "auto"],
                    help="decode and roofline run each; spec and heads run the first (default: float32, and "
                         "bfloat16 too for smollm2's decode and roofline)")
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens per prompt (default 64; 48 for smollm2)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--ks", type=int, nargs="+", default=None, help="draft k (default 2 3 4 6; 4 for smollm2)")
    ap.add_argument("--ngram-k", type=int, default=None, help="n-gram k (default 4; 5 for smollm2)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--num-prompts", type=int, default=None, help="prompts per set in spec (default 8; 2 for smollm2)")
    ap.add_argument("--sets", nargs="+", default=None, help="prompt sets for spec (default: every set of the target)")
    ap.add_argument("--methods", nargs="+", default=None, choices=["none", "ngram", "draft_model"],
                    help="spec rows to run (default: all; 'none' is the plain baseline the speedups need)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds per row in decode and heads (default 3)")
    ap.add_argument("--k", type=int, nargs="+", default=[4],
                    help="drafts per step, a tree's nodes (heads); several values run side by side, and the best "
                         "configuration of each method is printed and written")
    ap.add_argument("--head-methods", nargs="+", default=None, choices=["ngram", "draft_model", *HEAD_METHODS],
                    help="heads: only these methods' rows, beside plain decoding (default: every one)")
    ap.add_argument("--graft-tokens", type=int, default=GRAFT_TOKENS,
                    help="heads: every tree row (EAGLE's trees, the draft's star) once more with an n-gram chain of up to this "
                         f"many tokens grafted in (graft_method, lesson 10; default {GRAFT_TOKENS}, 0: no such rows)")
    ap.add_argument("--eagle-heads", nargs="+", default=None,
                    help="heads: run every EAGLE row with each of these heads (names under speclab/checkpoints/heads "
                         "or directories; default: the target's shipped head), to compare a newly trained one")
    ap.add_argument("--draft-dtypes", nargs="+", default=None, choices=list(DRAFT_DTYPES),
                    help="heads: run every model drafter's row (draft model, heads, trees) once per dtype "
                         "(speculative_config's draft_dtype; default: the target's dtype), e.g. float32 bfloat16")
    ap.add_argument("--seed", type=int, default=0, help="heads: the engines' stream; at T > 0 runs with one seed sample "
                                                        "the same answers, another seed other ones (default 0)")
    ap.add_argument("--json", default=None, help="heads: write the rows as JSON to this path")
    args = ap.parse_args(argv)
    if args.graft_tokens < 0:
        ap.error(f"--graft-tokens must be >= 0 (0: no grafted rows), got {args.graft_tokens}")
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # "Loading weights" bars would interleave with the tables
    real = is_real(args.target)
    defaults = dict(draft="smollm2-draft" if real else "draft", dtypes=["float32", "bfloat16"] if real else ["float32"],
                    max_tokens=48 if real else 64, ks=[4] if real else [2, 3, 4, 6], ngram_k=5 if real else 4,
                    num_prompts=2 if real else 8)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    model_directory(args.target)  # fail early on a bad path
    {"heads": bench_heads, "decode": bench_decode, "spec": bench_spec, "roofline": bench_roofline, "ngram": bench_ngram,
     "all": bench_all}[args.which](args)


if __name__ == "__main__":
    main()
