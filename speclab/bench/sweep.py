"""The concurrency sweep: throughput and latency against concurrency, with and without speculation.

    speclab bench serve --sweep --model smollm2 --concurrencies 1,4,16,64 --output-len 48 \
        --save-result --result-dir speclab/data --result-filename serve_sweep_smollm2

For each speculative config (default: none; n-gram k=4 always; the same with speclab's adaptive k)
a `speclab serve` subprocess is started on a free port with --max-num-seqs = the largest
concurrency; then, for each concurrency c, each server in turn gets the same `bench serve` load
(max concurrency c, max(min_prompts, prompts_per_concurrency x c) prompts). Interleaving the
servers at each c, and rotating their order on each of --sweep-repeats passes, spreads a shared
machine's noise over all configs alike. Results go to one JSON (settings, machine, and vLLM's result
keys per point and pass) and one figure; the table and figure show medians over the passes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from speclab.bench.serve import benchmark
from speclab.cpu_info import cpu_name

NGRAM_K4 = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
DEFAULT_CONFIGS = [
    {"label": "no speculation", "speculative_config": None},
    {"label": "n-gram k=4", "speculative_config": NGRAM_K4},
    {"label": "n-gram adaptive k<=4", "speculative_config": {**NGRAM_K4, "adaptive": True}},
]


def add_sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sweep", action="store_true", help="start servers and sweep concurrencies (speclab only)")
    p.add_argument("--concurrencies", default="1,4,16,64")
    p.add_argument("--sweep-configs", default=None,
                   help='JSON list of {"label", "speculative_config"} (default: none, n-gram k=4, adaptive)')
    p.add_argument("--prompts-per-concurrency", type=int, default=2)
    p.add_argument("--min-prompts", type=int, default=4)
    p.add_argument("--server-threads", type=int, default=1, help="torch threads of each server")
    p.add_argument("--sweep-repeats", type=int, default=1,
                   help="passes over every (concurrency, config), the configs' order rotated each pass; the table "
                        "and figure use the median of the passes")


def machine() -> str:
    return f"{cpu_name()}, {os.cpu_count()} logical CPUs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str | None, spec: dict | None, max_num_seqs: int, threads: int) -> tuple[subprocess.Popen, str]:
    import requests

    port = free_port()
    cmd = [sys.executable, "-m", "speclab.serve", *([model] if model else []), "--host", "127.0.0.1",
           "--port", str(port), "--max-num-seqs", str(max_num_seqs), "--max-pending-requests", str(4 * max_num_seqs)]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server {cmd} did not start")
        time.sleep(0.5)


def run_sweep(args, on_point=None) -> dict:
    """Run the sweep; `on_point(data)` is called after every point with the results so far."""
    import requests

    configs = json.loads(args.sweep_configs) if args.sweep_configs else DEFAULT_CONFIGS
    cs = [int(c) for c in args.concurrencies.split(",")]
    data = {"settings": sweep_settings(args, configs, cs), "results": []}
    results = data["results"]
    servers = [start_server(args.model, c["speculative_config"], max(cs), args.server_threads) for c in configs]
    try:
        for rep in range(args.sweep_repeats):
            for c in cs:
                order = list(range(len(configs)))
                order = order[rep % len(order):] + order[:rep % len(order)]  # rotate: no config always goes first
                for i in order:
                    cfg, (_, url) = configs[i], servers[i]
                    point = argparse.Namespace(**{**vars(args), "max_concurrency": c, "request_rate": float("inf"),
                                                  "num_prompts": max(args.min_prompts, args.prompts_per_concurrency * c),
                                                  "model": None})
                    r = benchmark(point, base_url=url, verbose=False)
                    r.update(label=cfg["label"], concurrency=c, speculative_config=cfg["speculative_config"], repeat=rep)
                    r["server_state"] = requests.get(url + "/debug/state", timeout=30).json()  # the k chosen, by batch
                    results.append(r)
                    if on_point is not None:
                        on_point(data)
                    acc = f", acceptance {r['spec_decode_acceptance_rate']:.0f}%" if "spec_decode_acceptance_rate" in r else ""
                    print(f"pass {rep} c={c:>3} {cfg['label']:<24} {r['output_throughput']:8.1f} tok/s  median TPOT "
                          f"{r['median_tpot_ms']:7.1f} ms  median TTFT {r['median_ttft_ms']:8.1f} ms  failed "
                          f"{r['failed']}{acc}", flush=True)
    finally:
        for proc, _ in servers:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # uvicorn waits for open connections; a killed run may leave some
                proc.kill()
                proc.wait()
    return data


def sweep_settings(args, configs, cs) -> dict:
    return {"model": args.model or "speclab-target", "concurrencies": cs, "configs": configs,
            "output_len": args.output_len, "ignore_eos": args.ignore_eos, "temperature": args.temperature,
            "dataset_name": args.dataset_name or "mixed", "server_threads": args.server_threads,
            "prompts_per_concurrency": args.prompts_per_concurrency, "min_prompts": args.min_prompts,
            "repeats": args.sweep_repeats, "machine": machine(),
            "command": " ".join(["speclab", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else " ".join(sys.argv)}


def median_points(data: dict) -> dict:
    """{(label, concurrency): {metric: median over the passes}} for the metrics the table and plot use."""
    import statistics
    groups: dict = {}
    for r in data["results"]:
        groups.setdefault((r["label"], r["concurrency"]), []).append(r)
    keys = ("output_throughput", "median_tpot_ms", "median_ttft_ms", "median_itl_ms")
    return {g: {k: statistics.median(r[k] for r in rs) for k in keys} | {"passes": len(rs)} for g, rs in groups.items()}


def table(data: dict) -> str:
    """Output tok/s per concurrency and config, and each config's ratio to the better of the first two."""
    labels = [c["label"] for c in data["settings"]["configs"]]
    cs = data["settings"]["concurrencies"]
    get = median_points(data)
    lines = [f"output tok/s (median of {data['settings'].get('repeats', 1)} pass(es))",
             f"{'concurrency':>11} " + " ".join(f"{lab[:22]:>22}" for lab in labels) + "  ratio to best of first two"]
    for c in cs:
        if any((lab, c) not in get for lab in labels):
            continue  # an interrupted sweep: this concurrency was not measured for every config
        tps = [get[(lab, c)]["output_throughput"] for lab in labels]
        best = max(tps[:2])
        lines.append(f"{c:>11} " + " ".join(f"{t:>22.1f}" for t in tps) + "  " +
                     " ".join(f"{t / best:.2f}" for t in tps[2:]))
    return "\n".join(lines)


def plot(data: dict, path: str | Path | None = None):
    """Output tokens/s and median TPOT against concurrency, one line per config."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    cs = data["settings"]["concurrencies"]
    points = median_points(data)
    for cfg in data["settings"]["configs"]:
        x = sorted(c for (lab, c) in points if lab == cfg["label"])
        rows = [points[(cfg["label"], c)] for c in x]
        axes[0].plot(x, [r["output_throughput"] for r in rows], "o-", label=cfg["label"])
        axes[1].plot(x, [r["median_tpot_ms"] for r in rows], "o-", label=cfg["label"])
        axes[2].plot(x, [r["median_ttft_ms"] for r in rows], "o-", label=cfg["label"])
    for ax, title in zip(axes, ["output tokens/s", "median TPOT (ms)", "median TTFT (ms)"]):
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrency (clients)")
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    s = data["settings"]
    fig.suptitle(f"speclab serve {s['model']}: {s['output_len']} tokens/request, {s['server_threads']} torch "
                 f"thread(s), {s['machine']}", fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def main(args) -> None:
    stem = Path(args.result_dir) / (args.result_filename or f"serve_sweep_{Path(args.model or 'speclab-target').name}")

    def save(data):  # after every point, so that an interrupted sweep keeps what it measured
        if args.save_result:
            stem.parent.mkdir(parents=True, exist_ok=True)
            stem.with_suffix(".json").write_text(json.dumps(data, indent=1))

    data = run_sweep(args, on_point=save)
    print(table(data))
    if args.save_result:
        save(data)
        plot(data, stem.with_suffix(".png"))
        print(f"saved {stem.with_suffix('.json')} and {stem.with_suffix('.png')}")
