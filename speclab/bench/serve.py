"""`speclab bench serve`: load a running server and report what `vllm bench serve` reports.

    speclab serve smollm2 --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}' &
    speclab bench serve --max-concurrency 8 --num-prompts 32 --save-result
    speclab bench serve --request-rate 4 --num-prompts 64          # Poisson arrivals, 4 requests/s

Definitions are vLLM's (`vllm/benchmarks/serve.py`), measured by the client on a streamed response:
TTFT = send -> first chunk with choices; ITL = gaps between chunks (per chunk, not per token: with
speculation one chunk carries every token a step accepted); E2EL = send -> last chunk; TPOT =
(E2EL - TTFT) / (output tokens - 1), for requests of more than one token; output tokens come from
the final usage chunk. Throughputs divide by the run's wall time. Acceptance comes from diffing
the server's `speclab:spec_decode_*` counters on /metrics before and after the run.

The sweep over concurrencies, with and without speculation, is in `speclab.bench.sweep`, which
builds on this module (never the other way round; the `speclab` command wires `--sweep` to it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path


@dataclass
class RequestResult:
    ok: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    start: float = 0.0
    error: str = ""


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help="the server (default http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=None, help="the served model name (default: the server's only model)")
    p.add_argument("--endpoint-type", choices=("completions", "chat"), default=None,
                   help="default: chat for the chat prompt sets, completions otherwise")
    p.add_argument("--dataset-name", default=None,
                   help="a prompt set: code, copy, prose (the embedded pair's) or edit, codegen, qa, chat (the real "
                        "model's held-out chat sets); 'mixed' takes every set of its kind in turn (default: mixed, of "
                        "the chat sets when the model is 'smollm2')")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (inf: all at once, bounded by --max-concurrency)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps; 1 = Poisson")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    p.add_argument("--output-len", type=int, default=64, help="max_tokens of every request")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --output-len tokens")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="prompt order and arrival times")
    p.add_argument("--metric-percentiles", default="50,99")
    p.add_argument("--label", default="speclab")
    p.add_argument("--save-result", action="store_true", help="write the result as JSON")
    p.add_argument("--result-dir", default=".")
    p.add_argument("--result-filename", default=None)


def load_dataset(name: str | None, model: str | None) -> tuple[list, bool]:
    """(prompts, chat): strings for completions, message lists for chat."""
    from speclab.data.chat_prompts import SETS, load_chat_prompts
    from speclab.data.prompts import KINDS, load_prompts

    chat_model = model is not None and "smollm2" in model
    name = name or "mixed"
    if name == "mixed":
        sets = [load_chat_prompts(k) for k in SETS] if chat_model else [load_prompts(k) for k in KINDS]
        return [p for group in zip(*sets) for p in group], chat_model
    if name in SETS:
        return load_chat_prompts(name), True
    if name in KINDS:
        return load_prompts(name), False
    raise ValueError(f"unknown --dataset-name {name!r}: one of {KINDS + SETS} or 'mixed'")


async def one_request(client, model: str, prompt, chat: bool, args) -> RequestResult:
    res = RequestResult(start=time.perf_counter())
    kw = dict(model=model, max_tokens=args.output_len, temperature=args.temperature, stream=True,
              stream_options={"include_usage": True}, extra_body={"ignore_eos": args.ignore_eos})
    try:
        if chat:
            stream = await client.chat.completions.create(messages=prompt, **kw)
        else:
            stream = await client.completions.create(prompt=prompt, **kw)
        last = None
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices:
                if last is None:
                    res.ttft = now - res.start
                else:
                    res.itls.append(now - last)
                last = now
            if chunk.usage is not None:
                res.output_tokens, res.prompt_len = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
        res.latency = (last or time.perf_counter()) - res.start
        res.ok = last is not None
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_load(base_url: str, model: str, prompts: list, chat: bool, args) -> tuple[list[RequestResult], float]:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=3600)
    rng = random.Random(args.seed)
    gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

    async def limited(p):
        if gate is None:
            return await one_request(client, model, p, chat, args)
        async with gate:
            return await one_request(client, model, p, chat, args)

    tasks, start = [], time.perf_counter()
    for p in prompts:
        tasks.append(asyncio.create_task(limited(p)))
        if args.request_rate != float("inf"):  # gamma gaps with mean 1/rate (burstiness 1: exponential)
            theta = 1.0 / (args.request_rate * args.burstiness)
            await asyncio.sleep(rng.gammavariate(args.burstiness, theta))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    await client.close()
    return results, duration


def spec_counters(base_url: str) -> dict:
    """The server's spec-decode counters from /metrics ({} when it does not speculate): speclab's
    `speclab:spec_decode_*` or, against `vllm serve`, the same names under `vllm:`."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    for fam in text_string_to_metric_families(requests.get(base_url + "/metrics", timeout=30).text):
        for s in fam.samples:
            prefix = s.name.split(":", 1)[0] + ":spec_decode_"
            if prefix in ("speclab:spec_decode_", "vllm:spec_decode_") and s.name.startswith(prefix) \
                    and s.name.endswith("_total"):
                key = s.name.removeprefix(prefix).removesuffix("_total")
                if "position" in s.labels:
                    out.setdefault(key, {})[int(s.labels["position"])] = s.value
                else:
                    out[key] = s.value
    return out


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    i = (len(xs) - 1) * q / 100
    lo, hi = int(i), min(int(i) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def summarize(results: list[RequestResult], duration: float, before: dict, after: dict, args) -> dict:
    """vLLM's result keys (ms for latencies)."""
    ok = [r for r in results if r.ok]
    out = {"duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
           "total_input_tokens": sum(r.prompt_len for r in ok), "total_output_tokens": sum(r.output_tokens for r in ok)}
    out["request_throughput"] = len(ok) / duration
    out["output_throughput"] = out["total_output_tokens"] / duration
    out["total_token_throughput"] = (out["total_input_tokens"] + out["total_output_tokens"]) / duration
    series = {"ttft": [r.ttft for r in ok], "itl": [x for r in ok for x in r.itls], "e2el": [r.latency for r in ok],
              "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]}
    pcts = [float(x) for x in args.metric_percentiles.split(",")]
    for name, xs in series.items():
        ms = [1000 * x for x in xs]
        out[f"mean_{name}_ms"] = statistics.fmean(ms) if ms else 0.0
        out[f"median_{name}_ms"] = statistics.median(ms) if ms else 0.0
        out[f"std_{name}_ms"] = statistics.pstdev(ms) if ms else 0.0
        for q in pcts:
            out[f"p{q:g}_{name}_ms"] = percentile(ms, q)
    if after.get("num_drafts") is not None:
        d = {k: after[k] - before.get(k, 0) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
        per_pos = after.get("num_accepted_tokens_per_pos", {})
        out.update(spec_decode_num_drafts=d["num_drafts"], spec_decode_draft_tokens=d["num_draft_tokens"],
                   spec_decode_accepted_tokens=d["num_accepted_tokens"],
                   spec_decode_acceptance_rate=100 * d["num_accepted_tokens"] / d["num_draft_tokens"]
                   if d["num_draft_tokens"] else 0.0,
                   spec_decode_acceptance_length=1 + d["num_accepted_tokens"] / d["num_drafts"] if d["num_drafts"] else 1.0,
                   spec_decode_per_position_acceptance_rates=[
                       (per_pos[i] - before.get("num_accepted_tokens_per_pos", {}).get(i, 0)) / d["num_drafts"]
                       if d["num_drafts"] else 0.0 for i in sorted(per_pos)])
    errors = [r.error for r in results if not r.ok]
    if errors:
        out["errors"] = errors[:5]
    return out


def print_result(r: dict, args) -> None:
    row = lambda k, v: print(f"{k:<40} {v:<10.2f}" if isinstance(v, float) else f"{k:<40} {v:<10}")  # noqa: E731
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    row("Successful requests:", r["completed"])
    row("Failed requests:", r["failed"])
    if args.max_concurrency:
        row("Maximum request concurrency:", args.max_concurrency)
    if args.request_rate != float("inf"):
        row("Request rate configured (RPS):", args.request_rate)
    row("Benchmark duration (s):", r["duration"])
    row("Total input tokens:", r["total_input_tokens"])
    row("Total generated tokens:", r["total_output_tokens"])
    row("Request throughput (req/s):", r["request_throughput"])
    row("Output token throughput (tok/s):", r["output_throughput"])
    row("Total token throughput (tok/s):", r["total_token_throughput"])
    for name, title in [("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")]:
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        row(f"Mean {name.upper()} (ms):", r[f"mean_{name}_ms"])
        row(f"Median {name.upper()} (ms):", r[f"median_{name}_ms"])
        for q in args.metric_percentiles.split(","):
            row(f"P{q} {name.upper()} (ms):", r[f"p{float(q):g}_{name}_ms"])
    if "spec_decode_num_drafts" in r:
        print("{s:{c}^{n}}".format(s="Speculative Decoding", n=50, c="-"))
        row("Acceptance rate (%):", r["spec_decode_acceptance_rate"])
        row("Acceptance length:", r["spec_decode_acceptance_length"])
        row("Drafts:", int(r["spec_decode_num_drafts"]))
        row("Draft tokens:", int(r["spec_decode_draft_tokens"]))
        row("Accepted tokens:", int(r["spec_decode_accepted_tokens"]))
        for i, a in enumerate(r["spec_decode_per_position_acceptance_rates"]):
            row(f"Position {i} acceptance (%):", 100 * a)
    print("=" * 50)


def run_async(coro):
    """asyncio.run, also from inside a running loop (a notebook): then in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def benchmark(args, base_url: str | None = None, verbose: bool = True) -> dict:
    """Run one benchmark against a running server; returns vLLM's result dict (+ run settings)."""
    import requests

    base_url = base_url or args.base_url or f"http://{args.host}:{args.port}"
    model = args.model or requests.get(base_url + "/v1/models", timeout=30).json()["data"][0]["id"]
    prompts, chat = load_dataset(args.dataset_name, model)
    if args.endpoint_type is not None:
        if (args.endpoint_type == "chat") != chat:
            raise ValueError(f"--endpoint-type {args.endpoint_type} does not fit the prompt set "
                             f"(chat sets need chat; the embedded sets need completions)")
    rng = random.Random(args.seed)
    order = [prompts[i % len(prompts)] for i in range(args.num_prompts)]
    rng.shuffle(order)
    run_async(run_load(base_url, model, order[:1], chat, argparse.Namespace(**{**vars(args), "max_concurrency": 1,
                                                                                  "request_rate": float("inf")})))
    before = spec_counters(base_url)
    results, duration = run_async(run_load(base_url, model, order, chat, args))
    after = spec_counters(base_url)
    r = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": "chat" if chat else "completions",
         "backend": "openai-chat" if chat else "openai", "label": args.label, "model_id": model,
         "num_prompts": args.num_prompts, "request_rate": "inf" if args.request_rate == float("inf") else args.request_rate,
         "burstiness": args.burstiness, "max_concurrency": args.max_concurrency, "output_len": args.output_len,
         "dataset_name": args.dataset_name or "mixed", **summarize(results, duration, before, after, args)}
    if verbose:
        print_result(r, args)
    return r


def main(args) -> None:
    r = benchmark(args)
    if args.save_result:
        rate = r["request_rate"]
        conc = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
        name = args.result_filename or f"{args.label}-{rate}qps{conc}-{Path(r['model_id']).name}-{r['date']}.json"
        path = Path(args.result_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(r, indent=2))
        print(f"saved {path}")
