"""The `speclab` command: `speclab serve [MODEL]` and `speclab bench serve`, flags named as vLLM's.

    speclab serve smollm2 --speculative-config '{"method": "ngram", "num_speculative_tokens": 5}' --port 8000
    speclab bench serve --model smollm2 --max-concurrency 8 --num-prompts 32 --save-result
    python -m speclab.serve ...            # the same as `speclab serve ...`

Safe defaults: the server binds 127.0.0.1 (loopback) unless --host says otherwise (vLLM binds every
interface when --host is unset; a course's laptop command should not serve a model to its network);
the API key comes from --api-key or the SPECLAB_API_KEY environment variable (which keeps it out of
`ps`); --max-model-len defaults to the model's context, capped at what the KV pool holds for one
request, and an explicit one the pool cannot hold is refused at startup (as vLLM refuses it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import threading

import torch

from speclab.bench.serve import add_bench_args
from speclab.bench.serve import main as bench_main
from speclab.bench.sweep import add_sweep_args
from speclab.bench.sweep import main as sweep_main
from speclab.llm import DTYPE_NAMES

logger = logging.getLogger("speclab.serve")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def json_arg(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}; quote it in single quotes, e.g. "
                                         f"--speculative-config '{{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}'")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def model_len_arg(text: str) -> int:
    """vLLM's --max-model-len: an integer, or with a suffix (1k = 1000, 1K = 1024, 25.6k = 25600)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"--max-model-len takes a token count such as 2048, 2k or 2K, got {text!r}")
    scale = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}[m.group(2)]
    value = float(m.group(1)) * scale
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"--max-model-len must be a whole number of tokens >= 1, got {text!r}")
    return int(value)


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="the embedded target (default), 'smollm2' (the real model), or a checkpoint directory")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address (default 127.0.0.1, this machine only; 0.0.0.0 serves every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--speculative-config", type=json_arg, default=None,
                   help="JSON of vLLM's speculative_config keys, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests running at once")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget of one step")
    p.add_argument("--max-model-len", type=model_len_arg, default=None,
                   help="context of a request, prompt + output (default: the model's, capped at what the KV pool "
                        "holds for one request)")
    p.add_argument("--seed", type=int, default=0, help="the engine's stream for requests without a seed")
    p.add_argument("--served-model-name", default=None, help="the name clients send as `model` (default: MODEL)")
    p.add_argument("--dtype", choices=["auto", *DTYPE_NAMES], default="auto",
                   help="vLLM's names; auto = the checkpoint's dtype, float32 for a float16 checkpoint on the CPU")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None, help="KV blocks in the pool (vLLM's name)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="share the KV blocks of prompt prefixes computed before (vLLM's flag; its default is on, "
                        "speclab's off; not with EAGLE/MTP heads)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template (a file or the template itself) for models without one")
    p.add_argument("--max-pending-requests", type=int, default=None,
                   help="requests held at once (running + waiting) before new ones get HTTP 503 "
                        "(default: 4 x max-num-seqs; speclab only)")
    p.add_argument("--max-request-body-bytes", type=int, default=None,
                   help="larger request bodies get HTTP 413 (default 1 MiB; speclab only)")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on every route but /health, /version, /metrics and "
                        "the docs (default: the SPECLAB_API_KEY environment variable, which stays out of `ps`)")
    p.add_argument("--log-level", default="warning")


def fit_context(llm, max_model_len: int | None) -> int:
    """Set the engine's max_model_len: the flag (refused if the pool cannot hold it) or the model's
    context capped at what the pool holds (with a warning)."""
    engine = llm.engine
    if max_model_len is None:
        context, fits = engine.model.config.max_position_embeddings, engine.pool_context_len()
        if fits < context:
            logger.warning("the KV pool holds one request of at most %d tokens, under the model's context of %d: "
                           "max_model_len is %d (raise --num-gpu-blocks-override for more)", fits, context, fits)
        max_model_len = min(context, fits)
    engine.set_max_model_len(max_model_len)
    return max_model_len


def build_server(args, on_dead=None):
    """The speclab.LLM and the app for parsed `serve` arguments."""
    from pathlib import Path

    from speclab.llm import LLM
    from speclab.serve.app import DEFAULT_MAX_BODY_BYTES, Server, build_app

    body_limit = DEFAULT_MAX_BODY_BYTES if args.max_request_body_bytes is None else args.max_request_body_bytes
    if body_limit < 1:
        raise ValueError(f"--max-request-body-bytes must be >= 1, got {body_limit}")
    llm = LLM(args.model, speculative_config=args.speculative_config, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed, dtype=args.dtype,
              block_size=args.block_size, num_kv_blocks=args.num_gpu_blocks_override,
              enable_prefix_caching=args.enable_prefix_caching)
    fit_context(llm, args.max_model_len)
    if args.chat_template is not None:
        path = Path(args.chat_template)
        llm.tokenizer.chat_template = path.read_text() if path.is_file() else args.chat_template
    name = args.served_model_name or args.model or "speclab-target"
    api_key = (args.api_key if args.api_key is not None else os.environ.get("SPECLAB_API_KEY")) or None
    server = Server(llm, name, args.max_pending_requests or 4 * args.max_num_seqs, api_key, on_dead)
    return server, build_app(server, body_limit)


def banner(server, args) -> str:
    where = f"http://{args.host}:{args.port}/v1"
    exposure = ("loopback only: pass --host 0.0.0.0 (with SPECLAB_API_KEY set) to serve other machines"
                if args.host in LOOPBACK else
                "reachable from the network" + ("" if server.api_key else
                                                ", WITHOUT an API key: set SPECLAB_API_KEY or --api-key"))
    return (f"speclab serve: {server.name} on {where} ({exposure}); speculative_config={args.speculative_config}, "
            f"max_model_len={server.max_model_len}, max_num_seqs={args.max_num_seqs}, "
            f"torch threads={torch.get_num_threads()}")


def serve(args) -> None:
    """Run the server until interrupted. If the engine loop dies, the process exits with status 1 within
    seconds, the cause logged (vLLM's watchdog), so that a supervisor restarts it."""
    import uvicorn

    holder: dict = {}

    def on_dead(e: BaseException) -> None:
        logger.critical("the engine loop died (%s: %s): shutting the server down", type(e).__name__, e)
        uv = holder.get("uvicorn")
        if uv is not None:
            uv.should_exit = True
        threading.Timer(10, lambda: os._exit(1)).start()  # if a graceful shutdown hangs

    server, app = build_server(args, on_dead)
    print(banner(server, args), flush=True)
    uv = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                       timeout_graceful_shutdown=5))
    holder["uvicorn"] = uv
    uv.run()
    if server.engine.error is not None:
        print(f"speclab serve: exiting with status 1: the engine loop died ({server.engine.error!r})",
              file=sys.stderr, flush=True)
        os._exit(1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="speclab", description="speclab's server and serving benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser("serve", help="an OpenAI-compatible server (as `vllm serve`)"))
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    bench_parser = bench.add_parser("serve", help="load a running server (as `vllm bench serve`)")
    add_bench_args(bench_parser)
    add_sweep_args(bench_parser)
    args = parser.parse_args(argv)
    if args.command == "serve":
        try:
            serve(args)
        except (ValueError, NotImplementedError, TypeError) as e:  # a bad flag value: say which, no traceback
            parser.error(str(e))
    elif args.sweep:
        sweep_main(args)
    else:
        bench_main(args)


def serve_main(argv=None) -> None:
    """`python -m speclab.serve ...`: the serve subcommand alone."""
    main(["serve", *(sys.argv[1:] if argv is None else argv)])
