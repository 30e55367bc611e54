"""`python -m speclab.bench heads`: every proposer side by side at batch 1 (lesson 08).

For each prompt set and temperature: plain decoding, n-gram, the draft model (`draft`, or
`smollm2-draft` for SmolLM2) and the heads (EAGLE, EAGLE-3-style, Medusa, MTP on the embedded
target; EAGLE on SmolLM2), each in
one engine run over the same prompts. Reported per row: tokens/s and the measured speedup over the
plain row of the same set and temperature; acceptance per position (accepted at position i / drafts);
alpha (Leviathan's: accepted / positions tested); mean acceptance length tau (1 + accepted / drafts);
the drafting cost c (the proposer's measured time per drafted token, over the plain row's time per
token); and two predictions from those measurements: tau / (1 + k c) (Leviathan's memory-bound
model) and tau / (v_k + k c), with v_k the measured cost of a (k + 1)-token target forward in
decode steps. Batch 1, one run: compare rows of the same run, not across runs.
"""

from __future__ import annotations

import torch

from speclab.data.chat_prompts import load_chat_prompts
from speclab.data.prompts import load_prompts
from speclab.llm import LLM
from speclab.sampling_params import SamplingParams
from speclab.timing import forward_seconds, timed, wrap_timed

EMBEDDED_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "medusa", "mtp")


def spec_config(method: str, k: int, temperature: float, draft: str) -> dict | None:
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    sample = "greedy" if temperature == 0 else "probabilistic"
    if method == "draft_model":
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": k, "draft_sample_method": sample}
    return {"method": method, "num_speculative_tokens": k, "draft_sample_method": sample}


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


def run_row(llm, prompts, temperature: float, max_tokens: int, chat: bool) -> tuple[float, int, dict]:
    """(seconds, tokens, drafting timer) over the prompts, one request at a time (batch 1)."""
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=not chat)
    call = (lambda p: llm.chat(p, params, use_tqdm=False)) if chat else (lambda p: llm.generate([p], params, use_tqdm=False))
    call(prompts[0])  # warm-up
    llm.engine.stats.reset()
    acc = time_proposer(llm)
    acc["seconds"], acc["drafted"] = 0.0, 0
    tokens, secs = 0, 0.0
    for p in prompts:
        out, seconds = timed(lambda: call(p))
        secs += seconds
        tokens += len(out[0].outputs[0].token_ids)
    return secs, tokens, acc


def bench_heads(args) -> None:
    real = args.target == "smollm2"
    k = args.k
    methods = ("none", "ngram", "draft_model", "eagle") if real else ("none",) + EMBEDDED_METHODS
    sets = tuple(args.sets or (("edit", "codegen", "qa", "chat") if real else ("code", "prose")))
    small = dict(max_num_seqs=4, kv_cache_gb=0.25)  # batch 1: a small pool, so that one LLM at a time fits
    plain = LLM(args.target, **small)
    t1 = forward_seconds(plain.model)
    v_k = forward_seconds(plain.model, tokens=k + 1) / t1
    print(f"{args.target}: batch 1, k = {k}, {args.max_tokens} new tokens, {args.num_prompts} prompts per set; "
          f"torch threads = {torch.get_num_threads()}; a {k + 1}-token target forward costs v_k = {v_k:.2f} decode steps")
    head = (f"{'set':<8}{'T':>3} {'method':<12}{'tok/s':>7}{'speedup':>8}{'pred':>7}{'pred2':>7}{'c':>7}{'alpha':>7}"
            f"{'tau':>6}  acceptance per position")
    prompt_sets = {kind: (load_chat_prompts(kind) if real else load_prompts(kind))[:args.num_prompts] for kind in sets}
    for temperature in args.temperatures:
        print("\n" + head)
        base = {}
        for m in methods:
            llm = plain if m == "none" else LLM(args.target, speculative_config=spec_config(m, k, temperature, args.draft),
                                                **small)
            for kind, prompts in prompt_sets.items():
                secs, tokens, acc = run_row(llm, prompts, temperature, args.max_tokens, chat=real)
                per_token = secs / tokens
                if m == "none":
                    base[kind] = per_token
                st = llm.engine.stats
                c = acc["seconds"] / max(acc["drafted"], 1) / base[kind] if m != "none" else 0.0
                tau = st.mean_acceptance_length if m != "none" else 1.0
                kk = k if m != "none" else 0
                pred, pred2 = tau / (1 + kk * c), tau / ((v_k if kk else 1.0) + kk * c)
                per_pos = " ".join(f"{a:.2f}" for a in st.acceptance_per_pos()) if m != "none" else ""
                alpha = st.alpha if m != "none" else float("nan")
                print(f"{kind:<8}{temperature:>3g} {m:<12}{1 / per_token:>7.1f}{base[kind] / per_token:>7.2f}x{pred:>6.2f}x"
                      f"{pred2:>6.2f}x{c:>7.3f}{alpha:>7.2f}{tau:>6.2f}  {per_pos}", flush=True)
            del llm
    print("\nspeedup: tokens/s over the plain row of the same set and T, this run; c: drafting seconds (propose, a "
          "head's pass over the step's hidden states included) per drafted token / plain seconds per token;\npred = tau / (1 + k c) (memory-bound "
          "target); pred2 = tau / (v_k + k c) with the measured verify cost v_k; T > 0 rows draft by sampling q "
          "(kept for verification), n-gram excepted.")
