"""A decode or verify step's decoder layers in one native call: the same kernels, no Python between them.

Once the projections (`cpu_gemm`), attention (`cpu_attention`) and the elementwise work
(`cpu_elementwise`) each ran in one C++ call, what was left of a SmolLM2 decode step beyond reading the
weights was Python: per layer five module calls, four `PackedLinear` calls, the kernels' checks, a
new tensor per op and ten ctypes calls, about 100 µs, so 3-4 ms of a 25-28 ms step (perf, 2026-12-06, a
2-core Zen 4 EPYC, one thread: 81 % of the samples in the projection kernel, 3 % in attention, most of
the rest in the interpreter and torch's dispatch). `cpu_decoder.cpp` runs layers i..j-1 in one call
and reaches each kernel through its own entry point (their addresses, taken from the libraries
ctypes loaded), so a token's outputs have the bits the module path gives: the same functions on the
same inputs in the same order (tests/test_05_cpu_decoder.py compares them bit for bit). On that Zen 4
(two runs of `python -m speclab.bench verify-cost --target smollm2`, which times both paths in the same
rounds) a float32 decode step went from 26.3-28.2 to 22.9-24.0 ms (1.17x; 62-65 % -> 71-76 % of the
roofline) and a 5-token forward 1.18-1.20x faster; bfloat16 1.14-1.25x and 1.27-1.40x.

`LlamaForCausalLM.prepare` (and an EAGLE or MTP head's, for its one layer) builds a `DecoderPlan` where it
applies (`llama.plan_decoder_layers`, then `plan_or_reason`); `forward` takes
it when `usable` says this step fits: float32 or bfloat16 on a CPU, one torch thread, at most
`cpu_gemm.MAX_ROWS` rows (a decode or verify step: the .cpp keeps its scratch rows between calls, so a
prompt's prefill, which gains little from it, stays with the modules), contiguous caches of the weights'
dtype. Anything else takes the modules, as before. SPECLAB_CPU_DECODER=0 turns it off.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from speclab.models import cpu_attention, cpu_elementwise, cpu_gemm, native

SOURCE = Path(__file__).with_name("cpu_decoder.cpp")
SWITCH = "SPECLAB_CPU_DECODER"
PHASES = ("projections", "attention", "rest")  # what a plan's `seconds` accumulate, in this order
SLOT_ERROR, BLOCK_ERROR = 1, 2  # the .cpp's return codes

_fns = None  # {dtype: the loaded entry point}, False once loading failed
_why = ""


def _load():
    global _fns, _why
    if _fns is None:
        p, n = ctypes.c_void_p, ctypes.c_long
        args = [p, p, n, p, p, p, p, p, p, p, p, p, p, ctypes.c_float, ctypes.c_float, p]
        fns = {}
        symbols = {torch.float32: "speclab_decoder_layers", torch.bfloat16: "speclab_decoder_layers_bf16"}
        for dtype, symbol in symbols.items():
            fns[dtype], _why = native.load(SOURCE, symbol, args, ctypes.c_int, SWITCH)
            if fns[dtype] is None:
                break
        _fns = fns if all(fns.get(d) for d in (torch.float32, torch.bfloat16)) else False
    return _fns


def available() -> bool:
    """Whether this call and the three kernels it strings together are built and loaded here."""
    return bool(_load()) and cpu_gemm.available() and cpu_elementwise.available() and cpu_attention.available()


_tables = {}  # dtype -> the .cpp's Kernels<T> (kept here, not in a plan: a copy.deepcopy of the model copies no ctypes)


def _kernels(dtype: torch.dtype):
    """The .cpp's Kernels<T> for `dtype`: the addresses of the five entry points the modules' path calls."""
    if dtype not in _tables:
        fns = [cpu_gemm.entry_point(dtype), *(cpu_elementwise.entry_point(name, dtype) for name in
                                               ("speclab_rms_norm", "speclab_rope_cache", "speclab_silu_mul")),
               cpu_attention.entry_point(dtype)]
        _tables[dtype] = (ctypes.c_void_p * 5)(*(ctypes.cast(f, ctypes.c_void_p).value for f in fns))
    return _tables[dtype]


class DecoderPlan:
    """Layers' weights and shapes for `cpu_decoder.cpp`, made once by `LlamaForCausalLM.prepare`.

    Args:
        weights: per layer (input norm, q/k/v, o, post-attention norm, gate/up, down) weights, the
            tensors the modules' kernels read (so a copy of the model has a plan over its own).
        cfg: the model's LlamaConfig.
    """

    def __init__(self, weights: list[tuple[torch.Tensor, ...]], cfg):
        self.weights, self.cfg = weights, cfg
        self.dtype = weights[0][1].dtype
        self.scale = cfg.head_dim ** -0.5
        self.seconds = None  # a zeroed (ctypes.c_double * 3) adds each call's time per phase (PHASES)

    def usable(self, x: torch.Tensor, kv_caches) -> bool:
        """Whether this forward's rows and caches fit the call (the module docstring's conditions)."""
        if x.dtype != self.dtype or not 0 < x.shape[0] <= cpu_gemm.MAX_ROWS or torch.get_num_threads() != 1:
            return False
        shape = kv_caches[0][0].shape
        return all(c.dtype == self.dtype and c.is_cpu and c.shape == shape and c.is_contiguous()
                   for pair in kv_caches for c in pair)

    def run(self, x: torch.Tensor, meta, kv_caches, start: int, stop: int) -> None:
        """Layers start..stop-1 over x (N, D), in place; their caches receive this step's keys and values."""
        cfg, (M, D) = self.cfg, x.shape
        k_cache = kv_caches[0][0]
        num_blocks, block_size = k_cache.shape[:2]
        positions, qsl, tables, trees, seen = meta.kernel_tables
        cos, sin = meta.rope(cfg.head_dim, cfg.rope_theta, x.dtype)
        slots = meta.slot_mapping
        if slots.dtype != torch.long or not slots.is_contiguous():
            slots = slots.to(torch.long).contiguous()
        dims = (ctypes.c_long * 11)(M, D, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                    cfg.intermediate_size, num_blocks, block_size, len(qsl) - 1, tables.shape[1],
                                    0 if seen is None else seen.shape[1])
        layers = torch.tensor([[w.data_ptr() for w in self.weights[i]] + [c.data_ptr() for c in kv_caches[i]]
                               for i in range(start, stop)], dtype=torch.int64)
        fn = _load()[self.dtype]
        failed = fn(_kernels(self.dtype), layers.data_ptr(), stop - start, dims, x.data_ptr(), cos.data_ptr(),
                    sin.data_ptr(), slots.data_ptr(), tables.data_ptr(), qsl.data_ptr(), positions.data_ptr(),
                    None if trees is None else trees.data_ptr(), None if seen is None else seen.data_ptr(),
                    cfg.rms_norm_eps, self.scale, self.seconds)
        if failed == SLOT_ERROR:
            raise IndexError(cpu_elementwise.SLOT_ERROR.format(num_slots=num_blocks * block_size))
        if failed == BLOCK_ERROR:
            raise ValueError(cpu_attention.BLOCK_ERROR)


def plan_or_reason(weights, cfg) -> tuple[DecoderPlan | None, str]:
    """(a plan, '') where the call applies to these layers, else (None, why not)."""
    if os.environ.get(SWITCH, "1") == "0":
        return None, f"{SWITCH}=0"
    if not available():
        return None, _why or "a kernel it calls is not available"
    dtype = weights[0][1].dtype if weights else None
    if dtype not in (torch.float32, torch.bfloat16):
        return None, f"the weights are {dtype}, not float32 or bfloat16"
    if any(w.dtype != dtype or not w.is_cpu or w.stride(-1) != 1 for layer in weights for w in layer):
        return None, "the layers' weights are not all CPU tensors of one dtype with contiguous rows"
    if cfg.head_dim % 8 or cfg.head_dim > min(cpu_attention.MAX_HEAD_DIM, cpu_elementwise.MAX_HEAD_DIM):
        return None, f"head_dim {cfg.head_dim} is not a multiple of 8 up to {cpu_attention.MAX_HEAD_DIM}"
    return DecoderPlan(weights, cfg), ""
