"""Benchmarks: ratios measured in one run, on one machine, never asserted in tests.

    python -m speclab.bench decode   # plain decoding: speclab vs transformers at batch 1, 8, 32
    python -m speclab.bench spec     # speculative decoding at batch 1: speclab vs transformers
    python -m speclab.bench ngram    # microseconds per n-gram proposal at 1K and 8K tokens of context
    python -m speclab.bench heads    # every proposer side by side, heads included (lesson 08; bench_heads.py)

Both use the embedded pair (or --target/--draft) on the held-out prompt sets of speclab/data,
warm up first, and print one table. Wall-clock numbers on a shared CPU are noisy: compare rows
of the same run, and rerun before believing a difference under ~10%.
"""

import argparse
import copy

import torch

from speclab import stats
from speclab.data.prompts import load_prompts
from speclab.llm import LLM, model_directory
from speclab.sampling_params import SamplingParams
from speclab.timing import forward_seconds, median_seconds, timed


def run_speclab(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[list[list[int]], float]:
    """(generated token ids per prompt, seconds) for one batched generate call."""
    outs, seconds = timed(lambda: llm.generate(prompts, params, use_tqdm=False))
    return [o.outputs[0].token_ids for o in outs], seconds


def run_hf(model, tokenizer, prompts: list[str], max_new_tokens: int, greedy: bool, **kwargs):
    """(generated ids per prompt, seconds) for transformers' generate on one left-padded batch."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    sampling = {} if greedy else dict(temperature=1.0, top_k=0, top_p=1.0)
    with torch.inference_mode():
        out, seconds = timed(lambda: model.generate(
            **enc, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=not greedy,
            pad_token_id=tokenizer.pad_token_id, **sampling, **kwargs))
    return [row[enc.input_ids.shape[1]:].tolist() for row in out], seconds


def bench_decode(args) -> None:
    """Plain decoding tokens/s: speclab's engine against transformers' generate, same checkpoint."""
    from speclab.models.hub import load_model, load_tokenizer

    llm = LLM(args.target, max_num_seqs=64)
    hf, tok = load_model(args.target), load_tokenizer(args.target)
    prompts = load_prompts("code")
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    run_speclab(llm, prompts[:2], params)  # warm-up
    run_hf(hf, tok, prompts[:2], 8, greedy=True)
    print(f"plain greedy decoding, {args.max_tokens} new tokens per prompt, torch threads = {torch.get_num_threads()}")
    print(f"{'batch':>5} {'speclab tok/s':>14} {'transformers tok/s':>19} {'ratio':>7} {'same tokens':>12}")
    for bs in args.batch_sizes:
        batch = (prompts * (bs // len(prompts) + 1))[:bs]
        ours, t_ours = run_speclab(llm, batch, params)
        theirs, t_hf = run_hf(hf, tok, batch, args.max_tokens, greedy=True)
        n = sum(map(len, ours))
        same = sum(a == b for a, b in zip(ours, theirs))
        print(f"{bs:>5} {n / t_ours:>14.1f} {n / t_hf:>19.1f} {t_hf / t_ours:>6.2f}x {same:>7}/{bs}")


def bench_spec(args) -> None:
    """Speculative decoding at batch 1: speclab's proposers against transformers' assisted generation."""
    from speclab.models.hub import load_model, load_tokenizer

    target_hf, draft_hf, tok = load_model(args.target), load_model(args.draft), load_tokenizer(args.target)
    target, draft = LLM(args.target).model, LLM(args.draft).model
    t1 = forward_seconds(target)
    c = forward_seconds(draft) / t1
    verify_cost = {k: forward_seconds(target, tokens=k + 1) / t1 for k in set(args.ks) | {4}}
    print(f"batch 1, {args.max_tokens} new tokens, {args.num_prompts} prompts per set; torch threads = "
          f"{torch.get_num_threads()}\nmeasured c = {c:.3f} (draft/target decode step); a target forward over k + 1 "
          f"tokens costs {', '.join(f'{v:.2f}' for k, v in sorted(verify_cost.items()))} decode steps "
          f"(k = {', '.join(map(str, sorted(verify_cost)))})")
    header = (f"{'set':<6}{'T':>3} {'method':<22}{'tok/s':>8}{'speedup':>9}{'pred':>7}{'pred2':>7}{'accept':>8}"
              f"{'alpha':>7}{'mean len':>9}{'HF tok/s':>10}{'HF spd':>8}")
    rows = [("code", "none", 0), ("copy", "none", 0), ("prose", "none", 0),
            ("copy", "ngram", 4), ("prose", "ngram", 4), ("code", "ngram", 4)]
    rows += [("code", "draft_model", k) for k in args.ks]
    for temperature in args.temperatures:
        greedy = temperature == 0
        print("\n" + header)
        base = {}
        for kind, method, k in rows:
            prompts = load_prompts(kind)[:args.num_prompts]
            config = None if method == "none" else (
                {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
                if method == "ngram" else {"method": "draft_model", "model": args.draft, "num_speculative_tokens": k,
                                           "draft_sample_method": "greedy" if greedy else "probabilistic"})
            llm = LLM(args.target, speculative_config=config)
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
            hf_tokens, hf_secs = 0, 0.0
            for prompt in prompts:
                out, t = run_hf(target_hf, tok, [prompt], args.max_tokens, greedy, **hf_kwargs)
                hf_tokens, hf_secs = hf_tokens + len(out[0]), hf_secs + t
            m = llm.engine.stats
            if method == "none":
                base[kind] = (tokens / secs, hf_tokens / hf_secs)
            speed, hf_speed = tokens / secs, hf_tokens / hf_secs
            ck = c if method == "draft_model" else 0.0
            pred = stats.speedup(m.alpha, k, ck) if k else 1.0
            # the same with the measured cost of verifying k + 1 tokens instead of the memory-bound 1
            pred2 = stats.expected_tokens(m.alpha, k) / (k * ck + verify_cost[k]) if k else 1.0
            print(f"{kind:<6}{temperature:>3g} {method + (f' k={k}' if k else ''):<22}{speed:>8.1f}"
                  f"{speed / base[kind][0]:>8.2f}x{pred:>6.2f}x{pred2:>6.2f}x{m.acceptance_rate:>8.2f}{m.alpha:>7.2f}"
                  f"{m.mean_acceptance_length:>9.2f}{hf_speed:>10.1f}{hf_speed / base[kind][1]:>7.2f}x")
    print("\nspeedup: tokens/s over plain decoding of the same set and temperature, measured in this run; pred: "
          "Leviathan's (1 - a^(k+1)) / ((1 - a)(k c + 1)) at the measured alpha and c (c = 0 for n-gram);\n"
          "pred2: the same with the measured cost of a (k + 1)-token target forward in place of 1 (the gap left "
          "to pred2 is the engine's per-step overhead);\n"
          "HF: transformers generate, plain / assistant_model (k drafts, constant schedule, threshold 0) / "
          "prompt_lookup_num_tokens = k, on the same checkpoints.")


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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=["decode", "spec", "ngram", "heads"])
    ap.add_argument("--target", default="target")
    ap.add_argument("--draft", default="draft")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 6])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--k", type=int, default=4, help="drafts per step (heads)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_directory(args.target)  # fail early on a bad path
    if args.which == "heads":
        from speclab.bench_heads import bench_heads
        return bench_heads(args)
    {"decode": bench_decode, "spec": bench_spec, "ngram": bench_ngram}[args.which](args)


if __name__ == "__main__":
    main()
