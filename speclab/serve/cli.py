"""The `speclab` command: `speclab serve [MODEL]` and `speclab bench serve`, flags named as vLLM's.

    speclab serve smollm2 --speculative-config '{"method": "ngram", "num_speculative_tokens": 5}' --port 8000
    speclab bench serve --model smollm2 --max-concurrency 8 --num-prompts 32 --save-result
    python -m speclab.serve ...            # the same as `speclab serve ...`
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from speclab.llm import DTYPE_NAMES


def json_arg(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}; quote it in single quotes, e.g. "
                                         f"--speculative-config '{{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}'")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="the embedded target (default), 'smollm2' (the real model), or a checkpoint directory")
    p.add_argument("--host", default=None, help="bind address (default: all interfaces)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--speculative-config", type=json_arg, default=None,
                   help="JSON of vLLM's speculative_config keys, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests running at once")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget of one step")
    p.add_argument("--seed", type=int, default=0, help="the engine's stream for requests without a seed")
    p.add_argument("--served-model-name", default=None, help="the name clients send as `model` (default: MODEL)")
    p.add_argument("--dtype", choices=["auto", *DTYPE_NAMES], default="auto",
                   help="vLLM's names; auto = the checkpoint's dtype, float32 for a float16 checkpoint on the CPU")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None, help="KV blocks in the pool (vLLM's name)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template (a file or the template itself) for models without one")
    p.add_argument("--max-pending-requests", type=int, default=None,
                   help="requests held at once (running + waiting) before new ones get HTTP 503 "
                        "(default: 4 x max-num-seqs; speclab only)")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1 paths")
    p.add_argument("--log-level", default="warning")


def build_server(args):
    """The speclab.LLM and the app for parsed `serve` arguments."""
    from pathlib import Path

    from speclab.llm import LLM
    from speclab.serve.app import Server, build_app

    llm = LLM(args.model, speculative_config=args.speculative_config, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed, dtype=args.dtype,
              block_size=args.block_size, num_kv_blocks=args.num_gpu_blocks_override)
    if args.chat_template is not None:
        path = Path(args.chat_template)
        llm.tokenizer.chat_template = path.read_text() if path.is_file() else args.chat_template
    name = args.served_model_name or args.model or "speclab-target"
    server = Server(llm, name, args.max_pending_requests or 4 * args.max_num_seqs, args.api_key)
    return server, build_app(server)


def serve(args) -> None:
    import uvicorn

    server, app = build_server(args)
    print(f"speclab serve: {server.name} on http://{args.host or '0.0.0.0'}:{args.port}/v1 "
          f"(speculative_config={args.speculative_config}, max_num_seqs={args.max_num_seqs}, "
          f"torch threads={torch.get_num_threads()})", flush=True)
    uvicorn.run(app, host=args.host or "", port=args.port, log_level=args.log_level)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="speclab", description="speclab's server and serving benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser("serve", help="an OpenAI-compatible server (as `vllm serve`)"))
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    from speclab.serve.bench_serve import add_bench_args
    add_bench_args(bench.add_parser("serve", help="load a running server (as `vllm bench serve`)"))
    args = parser.parse_args(argv)
    if args.command == "serve":
        try:
            serve(args)
        except (ValueError, NotImplementedError, TypeError) as e:  # a bad flag value: say which, no traceback
            parser.error(str(e))
    else:
        from speclab.serve.bench_serve import main as bench_main
        bench_main(args)


def serve_main(argv=None) -> None:
    """`python -m speclab.serve ...`: the serve subcommand alone."""
    main(["serve", *(sys.argv[1:] if argv is None else argv)])
