"""A forward's projections alone, float32 and bfloat16: speclab's few-row kernel against torch's paths.

    python -m speclab.bench gemm [--target smollm2] [--rows 1 2 3 5 9 16] [--rounds 7] [--json PATH]

The products of one forward of the target over M rows (M = 1 is a batch-1 decode step, k + 1 a
verify step): every layer's fused qkv, o, gate_up and down projection and the LM head, with weights
of the target's shapes (random values: the time depends on the shapes only), one copy per layer, so
each product reads its weight from memory as a forward does. Columns, each a path `PackedLinear` can
take: speclab's kernel (`cpu_gemm`: float32; bfloat16 on its best path here and on those below it the CPU has),
`F.linear` on the (out, in) weight, oneDNN on that weight (what more than 16 rows take until a packed copy pays)
and oneDNN's packed copy (what a batch's verify steps of 17-64 rows take once it pays). Each cell is
the median over `--rounds` interleaved rounds (every path at every M once per round) in ms, with the
weights' read rate in GB/s and the cost in one-row products of the same path. Speeds are printed,
never asserted; the machine's load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.models import cpu_gemm
from speclab.models.hub import model_directory
from speclab.models.llama import LlamaConfig
from speclab.models.packed_linear import packing_enabled
from speclab.timing import machine_info


def projection_shapes(cfg: LlamaConfig) -> list[tuple[int, int]]:
    """(out, in) of every product of one forward: per layer qkv, o, gate_up, down; then the LM head."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    layer = [(q + 2 * kv, cfg.hidden_size), (cfg.hidden_size, q),
             (2 * cfg.intermediate_size, cfg.hidden_size), (cfg.hidden_size, cfg.intermediate_size)]
    return layer * cfg.num_hidden_layers + [(cfg.vocab_size, cfg.hidden_size)]


def paths(dtype: torch.dtype) -> dict:
    """name -> (prepare(weight) -> operand, product(x, operand))."""
    plain = (lambda w: w, F.linear)
    onednn = (lambda w: w, lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
    packed = (lambda w: torch.ops.mkldnn._reorder_linear_weight(w, 4), onednn[1])
    if dtype == torch.float32:
        return {"kernel": (lambda w: w, cpu_gemm.xwt), "F.linear": plain, "oneDNN": onednn, "oneDNN packed": packed}
    kernels = {f"kernel {name}": (lambda w: w, lambda x, w, name=name: cpu_gemm.xwt(x, w, name))
               for name in bf16_kernel_paths()}
    return {**kernels, "F.linear": plain, **({"oneDNN": onednn, "oneDNN packed": packed} if bf16_packing() else {})}


def bf16_packing() -> bool:
    """Whether oneDNN packs bfloat16 weights here (it needs AVX512-BW/VL/DQ or AVX-NE-CONVERT: not on an
    AVX2 Zen 3, where `PackedLinear` keeps bfloat16 on `F.linear` for the same reason)."""
    return packing_enabled(torch.zeros(16, 16, dtype=torch.bfloat16))


def bf16_kernel_paths() -> list[str]:
    """The kernel's bfloat16 paths this CPU runs: its best, and below it AVX512-BF16 where the CPU has
    that instruction (a path it lacks would fall back and only repeat the widened column)."""
    vector = cpu_gemm.bf16_path(17, 16, 32)  # past AMX's 16 rows: the vector path
    return ["best"] + (["avx512_bf16"] if vector == "avx512_bf16" else []) + ["widened"]


def measure(shapes, dtype, rows: list[int], rounds: int) -> list[dict]:
    """One row per (path, M): median ms over the rounds, GB/s and the cost in one-row products."""
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g).to(dtype) for n, k in shapes]
    operands = {name: [prep(w) for w in weights] for name, (prep, _) in paths(dtype).items()}
    xs = {(m, k): torch.randn(m, k, generator=g).to(dtype) for m in rows for k in {k for _, k in shapes}}
    times = {(name, m): [] for name in operands for m in rows}
    for _ in range(rounds + 1):  # the first round warms up
        for m in rows:
            for name, (_, product) in paths(dtype).items():
                t0 = time.perf_counter()
                for (_, k), op in zip(shapes, operands[name]):
                    product(xs[(m, k)], op)
                times[(name, m)].append(time.perf_counter() - t0)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    out = []
    for name in operands:
        one = statistics.median(times[(name, rows[0])][1:])
        for m in rows:
            ms = statistics.median(times[(name, m)][1:])
            out.append({"dtype": str(dtype).removeprefix("torch."), "path": name, "rows": m, "ms": 1e3 * ms,
                        "gb_per_s": nbytes / ms / 1e9, "one_row_products": ms / one})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m speclab.bench gemm", description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2", help="'target' (embedded), 'smollm2', or a checkpoint directory")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 5, 9, 16])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not cpu_gemm.available():
        raise SystemExit(f"speclab's few-row kernel is not available here ({cpu_gemm.why_unavailable()}): "
                         "install g++ or clang++ (or set CXX), and unset SPECLAB_CPU_GEMM=0")
    cfg = LlamaConfig.from_hf(json.loads((Path(model_directory(args.target)) / "config.json").read_text()))
    shapes = projection_shapes(cfg)
    info = machine_info(1)
    bf16 = {m: cpu_gemm.bf16_path(m, *shapes[0]) for m in args.rows}
    print(f"gemm: {args.target}'s {len(shapes)} products of one forward, weights streamed; {args.rounds} interleaved "
          f"rounds, medians; {info['cpu']}, torch {info['torch']}, 1 thread; load average {info['load_average']}\n"
          f"kernel best (bfloat16) is, by rows: " + ", ".join(f"{m}: {p}" for m, p in bf16.items())
          + ("" if bf16_packing() else "\noneDNN does not pack bfloat16 on this CPU: no 'oneDNN packed' bfloat16 row"))
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        got = measure(shapes, dtype, args.rows, args.rounds)
        rows += got
        print(f"\n{str(dtype).removeprefix('torch.')}: ms (GB/s, one-row products of the same path)")
        print(f"{'path':<22}" + "".join(f"{f'M = {m}':>22}" for m in args.rows))
        for name in dict.fromkeys(r["path"] for r in got):
            cells = [r for r in got if r["path"] == name]
            print(f"{name:<22}" + "".join(f"{c['ms']:>8.1f} ({c['gb_per_s']:4.1f}, {c['one_row_products']:.2f})"
                                          for c in cells))
    info["load_average_at_the_end"] = machine_info()["load_average"]
    print(f"\nload average at the end {info['load_average_at_the_end']}; compare rows of one run.")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "target": args.target, "bf16_path": bf16,
                                               "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
