"""speclab's own Llama forward, whose attention reads and writes a paged KV cache.

The architecture of Touvron et al., "LLaMA" (2023), as Hugging Face's `LlamaForCausalLM` lays it
out (RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query attention), so any Llama
checkpoint directory (config.json + safetensors) loads with its parameter names unchanged.

What differs from transformers is the input: one *flattened* batch of tokens from many requests
(a prefill chunk of one, a single decode token of another, k + 1 tokens to verify of a third),
with `AttentionMetadata` saying which request each token belongs to, where its key and value are
written (`slot_mapping`), and which cache blocks hold each request's past (`block_tables`).
This is how vLLM runs a ragged batch in one forward.
"""

import json
import math
import mmap
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from speclab.models import cpu_attention, cpu_decoder, cpu_elementwise, cpu_gemm, huge_pages
from speclab.models.packed_linear import PackedLinear


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    eos_token_id: int | None = None
    bos_token_id: int | None = None

    @classmethod
    def from_hf(cls, d: dict) -> "LlamaConfig":
        """From a Hugging Face config.json dict; refuses features this forward does not implement."""
        if d.get("model_type", "llama") != "llama":
            raise ValueError(f"model_type={d.get('model_type')!r}: speclab's engine runs Llama-architecture models only")
        rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise ValueError(f"rope scaling {rope} is not supported: use a checkpoint with plain RoPE")
        if d.get("attention_bias") or d.get("mlp_bias"):
            raise ValueError("attention_bias / mlp_bias are not supported by speclab's Llama forward")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={d['hidden_act']!r}: only silu (SwiGLU) is supported")
        heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", d.get("rope_theta", 10000.0)),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            eos_token_id=eos[0] if isinstance(eos, list) else eos, bos_token_id=d.get("bos_token_id"))


@dataclass
class AttentionMetadata:
    """Where each token of a flattened batch of N tokens from B requests reads and writes the cache.

    Attributes:
        positions: (N,) position of each token in its own sequence.
        slot_mapping: (N,) cache slot (block * block_size + offset) that receives its key and value.
        query_start_loc: (B + 1,) request b's tokens are rows [query_start_loc[b], query_start_loc[b+1]).
        seq_lens: (B,) tokens in each request's cache after this forward (past + new).
        block_tables: (B, max_blocks) block ids of each request's cache, padded with -1.
        tree_masks: per request, None (causal: a token at position t sees cache slots 0..t) or, for a
            tree of drafts (lesson 10), (base, mask): mask (n_new, seq_len - base) bool says which of the
            slots from `base` on each new token sees (itself and its ancestors); slots before `base`
            (the committed past) are seen by all. None: no request has a tree.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: torch.Tensor
    tree_masks: list | None = None
    _shared: dict = field(default_factory=dict, repr=False)  # per-forward tables and buffers of every layer

    def rope(self, head_dim: int, theta: float, dtype):
        """cos, sin tables at this batch's positions, computed once per forward (every layer shares them)."""
        key = (head_dim, theta, dtype)
        if key not in self._shared:
            self._shared[key] = rope_tables(self.positions, head_dim, theta, dtype)
        return self._shared[key]

    @cached_property
    def padded(self):
        """The batch as a (B, Qmax) rectangle, computed once per forward and shared by every layer.

        Returns:
            row, col: (N,) each token's request and index among that request's new tokens, or None
                when every request has Qmax new tokens (a decode batch: the rectangle is a reshape);
            mask: (B, 1, Qmax, Cmax) bool: query i of request b, at position t, sees keys 0..t of its
                own cache; None when it would be all True (one request, one new token);
            Qmax; Cmax (the longest cache).
        """
        device = self.positions.device
        q_lens = [b - a for a, b in zip(self.query_start_loc, self.query_start_loc[1:])]
        q_max, c_max = max(q_lens), max(self.seq_lens)
        if min(q_lens) == q_max:  # every request has q_max new tokens: no padding
            row = col = None
            pos = self.positions.view(len(q_lens), q_max)
        else:
            starts = torch.tensor(self.query_start_loc, device=device)
            row = torch.repeat_interleave(torch.arange(len(q_lens), device=device), starts[1:] - starts[:-1])
            col = torch.arange(len(row), device=device) - starts[:-1][row]
            pos = torch.zeros(len(q_lens), q_max, dtype=torch.long, device=device)  # padding queries at 0
            pos[row, col] = self.positions
        mask = None
        if len(q_lens) > 1 or q_max > 1 or self.tree_masks:
            mask = (torch.arange(c_max, device=device)[None, None, :] <= pos[:, :, None])[:, None]
        for b, tree in enumerate(self.tree_masks or ()):  # a tree's nodes see their ancestors only
            if tree is not None:
                base, m = tree
                mask[b, 0, :m.shape[0], base:base + m.shape[1]] = m.to(device)
        return row, col, mask, q_max, c_max

    @cached_property
    def kernel_tables(self):
        """(positions, query_start_loc, block_tables) as contiguous int64 CPU tensors and the trees'
        (trees, seen) tables (None, None without a tree), made once per forward for
        speclab.models.cpu_attention."""
        return (self.positions.to(torch.long).contiguous(), torch.tensor(self.query_start_loc, dtype=torch.long),
                self.block_tables.to(torch.long).contiguous(),
                *cpu_attention.tree_tables(self.tree_masks, self.query_start_loc, self.seq_lens))

    def gather_plan(self, block_size: int, entry_shape, dtype):
        """(blocks, k_buf, v_buf), made once per forward and shared by every layer: the cache blocks
        that request b reads are blocks[b * nb:(b + 1) * nb] (padding -1 reads block 0, whose slots lie
        past the request's length and are masked), and two (B * nb, block_size, *entry_shape) buffers
        the layers gather keys and values into: one allocation per forward, not two per layer (a fresh
        buffer this size costs a page fault per 4 KB on every call, which made the gather the costliest
        op of a decode step after the matmuls)."""
        key = ("gather", block_size, tuple(entry_shape), dtype)
        if key not in self._shared:
            nb = math.ceil(max(self.seq_lens) / block_size)
            blocks = self.block_tables[:, :nb].reshape(-1).clamp(min=0)  # (B * nb,)
            shape = (len(blocks), block_size, *entry_shape)
            device = self.positions.device
            self._shared[key] = (blocks, torch.empty(shape, dtype=dtype, device=device),
                                 torch.empty(shape, dtype=dtype, device=device))
        return self._shared[key]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # (N, D): HF's order, x * rsqrt(mean(x^2) + eps) in float32, then * weight in x's dtype
        if x.dim() == 2 and cpu_elementwise.applies(x, self.weight):  # one pass (cpu_elementwise), not six ops
            return cpu_elementwise.rms_norm(x, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def kv_zeros(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A zeroed KV-cache tensor. On a CPU its memory is an anonymous mapping: the kernel hands out
    zero pages as they are first written, so a pool sized for 64 full-context requests (SmolLM2's
    default 1 GB) costs what the blocks in use hold, not 1 GB at start-up. The pool's FIFO free
    queue reaches every block over a long run, so a server grows to the full pool; a lesson, a test
    or the demo stays at what it touched. (`torch.zeros` writes every byte, so all of it is resident
    at once.) The values are the same zeros either way; on a GPU it is `torch.zeros`."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    n = math.prod(shape) * dtype.itemsize
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, n), dtype=dtype).view(shape)  # the tensor keeps the mapping alive


_ROPE: dict = {}  # (head_dim, theta, dtype, device) -> (cos, sin) for positions 0..n-1, grown by doubling


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles at `positions`: two (N, 1, Dh) tensors (HF Llama's layout).

    Rows of a table computed once per (head_dim, theta, dtype, device) and grown as positions do:
    building them afresh took 35-38 us a call, the gather takes 7 (4 positions, one thread, 2026-12-07;
    once per target forward and per EAGLE head call, every step). A position's row is the same whatever
    batch it comes in."""
    if positions.numel() == 0:
        return (torch.empty(0, 1, head_dim, dtype=dtype, device=positions.device),) * 2
    key = (head_dim, theta, dtype, positions.device)
    need = int(positions.max()) + 1
    table = _ROPE.get(key)
    if table is None or table[0].shape[0] < need:
        table = _ROPE[key] = _rope_rows(max(4096, 1 << (need - 1).bit_length()), head_dim, theta, dtype, positions.device)
    return table[0].index_select(0, positions), table[1].index_select(0, positions)


@torch.inference_mode(False)  # ordinary tensors, made in a drafting step or not, usable by training's autograd too
def _rope_rows(n: int, head_dim: int, theta: float, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """rope_tables' table: cos and sin at positions 0..n-1, (n, 1, Dh) each."""
    half = head_dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half, dtype=torch.float32, device=device) / half)
    angles = torch.arange(n, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]  # (n, Dh/2)
    return (torch.cat([angles.cos()] * 2, -1)[:, None, :].to(dtype),
            torch.cat([angles.sin()] * 2, -1)[:, None, :].to(dtype))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split layout (as HF Llama): x (N, H, Dh)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def paged_attention(q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
    """Causal attention of a flattened ragged batch over each request's paged cache, in one call.

    Query i of request b (at position t) sees keys 0..t of its own cache (a tree's node: the committed
    keys and its ancestors', `meta.tree_masks`). On a CPU in float32 or bf16 with one thread, the
    batch takes speclab's kernel (speclab.models.cpu_attention), which reads each token's slots in
    place. Otherwise (another dtype or device, more threads) the B requests are padded to a
    rectangle: queries (B, Qmax), keys and values gathered through the block tables (B, Cmax), one
    masked SDPA over it.

    Args:
        q: (N, H, Dh) queries of all requests' new tokens.
        k_cache, v_cache: (num_blocks, block_size, Hkv, Dh), already holding this step's keys/values.
    Returns:
        (N, H, Dh) attention outputs, in the flattened order.
    """
    if cpu_attention.applies(q, k_cache):
        return cpu_attention.paged_attention(q, k_cache, v_cache, *meta.kernel_tables)
    N, H, Dh = q.shape
    B, block_size = len(meta.seq_lens), k_cache.shape[1]
    row, col, mask, q_max, c_max = meta.padded
    if row is None:
        q_pad = q.view(B, q_max, H, Dh)
    else:
        q_pad = q.new_zeros(B, q_max, H, Dh)
        q_pad[row, col] = q
    # index_select, not k_cache[blocks]: a 2-D advanced-indexing gather costs ~1 ms on a CPU, this ~µs.
    blocks, k_buf, v_buf = meta.gather_plan(block_size, k_cache.shape[2:], k_cache.dtype)
    keys = torch.index_select(k_cache, 0, blocks, out=k_buf).view(B, -1, *k_cache.shape[2:])[:, :c_max]
    values = torch.index_select(v_cache, 0, blocks, out=v_buf).view(B, -1, *v_cache.shape[2:])[:, :c_max]
    if q.dtype != torch.float32 and q.device.type == "cpu":
        # attention in float32: torch's CPU flash kernel is 4-6x slower in bfloat16 with one query
        # per request (measured 95 vs 23 µs over 129 keys), and float32 is the more accurate
        q_pad, keys, values = q_pad.float(), keys.float(), values.float()
    out = F.scaled_dot_product_attention(q_pad.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=mask, enable_gqa=H != k_cache.shape[2])  # (B, H, Qmax, Dh)
    out = out.transpose(1, 2).to(q.dtype)
    return out.reshape(N, H, Dh) if row is None else out[row, col]  # (N, H, Dh)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        H, Hkv, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, H * Dh, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, Hkv * Dh, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, Hkv * Dh, bias=False)
        self.o_proj = nn.Linear(H * Dh, cfg.hidden_size, bias=False)

    def prepare(self, arena=None) -> None:
        """One (H + 2 Hkv) Dh x D projection for q, k and v: one weight read instead of three."""
        self.qkv = PackedLinear(fuse(self.q_proj, self.k_proj, self.v_proj, arena=arena))
        self.o = PackedLinear(fuse(self.o_proj, arena=arena))

    def forward(self, x, meta: AttentionMetadata, k_cache, v_cache):
        """x: (N, D); k_cache, v_cache: (num_blocks, block_size, Hkv, Dh), written in place."""
        cfg, N = self.cfg, x.shape[0]
        H, Hkv, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        cos, sin = meta.rope(Dh, cfg.rope_theta, x.dtype)
        if "qkv" in self.__dict__:  # prepared (LlamaForCausalLM and the heads prepare before their first forward)
            qkv = self.qkv(x)  # (N, (H + 2 Hkv) Dh)
        else:  # a layer used on its own: the plain projections, same function
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        if cpu_elementwise.applies(qkv, k_cache) and Dh <= cpu_elementwise.MAX_HEAD_DIM:  # one pass, in place
            cpu_elementwise.rope_cache(qkv, cos, sin, meta.slot_mapping, k_cache, v_cache, H, Hkv)
            q = qkv[:, :H * Dh].view(N, H, Dh)
        else:
            qk = rotate(qkv[:, :(H + Hkv) * Dh].view(N, H + Hkv, Dh), cos, sin)  # q's and k's heads at once
            q, k, v = qk[:, :H], qk[:, H:], qkv[:, (H + Hkv) * Dh:]
            k_cache.view(-1, Hkv * Dh).index_copy_(0, meta.slot_mapping, k.reshape(N, Hkv * Dh))  # this step's
            v_cache.view(-1, Hkv * Dh).index_copy_(0, meta.slot_mapping, v)                       # keys, values
        out = paged_attention(q, k_cache, v_cache, meta)  # (N, H, Dh)
        out = out.reshape(N, H * Dh)
        return self.o(out) if "o" in self.__dict__ else self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def prepare(self, arena=None) -> None:
        """One 2I x D projection for gate and up."""
        self.gate_up = PackedLinear(fuse(self.gate_proj, self.up_proj, arena=arena))
        self.down = PackedLinear(fuse(self.down_proj, arena=arena))

    def forward(self, x):
        if torch.is_grad_enabled() or "gate_up" not in self.__dict__:
            # training a head (autograd needs the plain weights; packed ones have no gradient), or a
            # layer used on its own: the same function through the unfused projections
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate_up = self.gate_up(x)  # (N, 2 I): gate, then up
        if cpu_elementwise.applies(gate_up):
            return self.down(cpu_elementwise.silu_mul(gate_up))  # SwiGLU in one pass (cpu_elementwise)
        gate, up = gate_up.chunk(2, dim=-1)  # (N, I) each
        return self.down(F.silu(gate) * up)  # SwiGLU


def fuse(*modules: nn.Module, arena: huge_pages.Arena | None = None) -> torch.Tensor:
    """The weights of `modules` (Linear or Embedding, each (out, in)) concatenated along the output
    dimension. Float32 on a CPU keeps (out, in) rows where speclab's few-row kernel is built
    (speclab.models.cpu_gemm reads rows); without it, it is stored transposed, (in, sum of outs)
    contiguous, the layout MKL's one-row product reads fastest (speclab.models.packed_linear).
    Returns the (sum of outs, in) tensor or view; each module's weight becomes a view into it, so
    the model holds one copy and a state dict still loads into it. (Other dtypes keep (out, in): their one-row product gains nothing
    from it, and in bfloat16 the transposed layout made a row's logits differ between a one-row and
    a many-row forward, enough to change greedy output with speculation: tests/test_10_smollm2_spec.)
    With an `arena` the fused weight is placed in it (huge pages: speclab.models.huge_pages)."""
    weights = [m.weight.detach() for m in modules]
    transpose = weights[0].dtype == torch.float32 and weights[0].device.type == "cpu" and not cpu_gemm.available()
    if arena is not None and len(weights) == 1 and not transpose:
        fused = arena.place(weights[0])  # one copy, no intermediate (the output head is 113 MB in float32)
    else:
        fused = torch.cat(weights)  # (sum of outs, in)
        if transpose:
            fused = fused.t().contiguous().t()  # the same values, (in, sum of outs) in memory
        if arena is not None:
            fused = arena.place(fused)
    start = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(fused[start:start + rows], requires_grad=m.weight.requires_grad)
        start += rows
    return fused


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, meta, k_cache, v_cache):
        x = x + self.self_attn(self.input_layernorm(x), meta, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


def plan_decoder_layers(layers, cfg: LlamaConfig):
    """(cpu_decoder's plan over prepared `layers`, '') where its one call can stand in for their forwards,
    else (None, why not). The model and the EAGLE head's layer both take it."""
    if any(type(layer) is not DecoderLayer or type(layer.self_attn) is not Attention or type(layer.mlp) is not MLP
           or type(layer.input_layernorm) is not RMSNorm or type(layer.post_attention_layernorm) is not RMSNorm
           for layer in layers):  # a subclass may compute something else: its forward runs
        return None, "a layer is not speclab's DecoderLayer of Attention, MLP and RMSNorm"
    if not all("qkv" in layer.self_attn.__dict__ and "gate_up" in layer.mlp.__dict__ for layer in layers):
        return None, "the layers are not prepared (fused projections)"
    linears = [p for layer in layers
               for p in (layer.self_attn.qkv, layer.self_attn.o, layer.mlp.gate_up, layer.mlp.down)]
    if not all(p.few_rows for p in linears):
        return None, "the projections do not take speclab's few-row kernel (cpu_gemm)"
    if any(n.eps != cfg.rms_norm_eps for layer in layers
           for n in (layer.input_layernorm, layer.post_attention_layernorm)):
        return None, "a norm's eps differs from the config's"
    weights = [(layer.input_layernorm.weight, layer.self_attn.qkv.weight, layer.self_attn.o.weight,
                layer.post_attention_layernorm.weight, layer.mlp.gate_up.weight, layer.mlp.down.weight)
               for layer in layers]
    return cpu_decoder.plan_or_reason(weights, cfg)


class LlamaBody(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Parameter names match transformers' LlamaForCausalLM, so its state dicts load as they are."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._prepared = False
        self.decoder_plan, self.decoder_why = None, "not prepared yet"  # cpu_decoder's plan, or why there is none

    @torch.inference_mode(False)  # weights stay ordinary tensors when the first forward prepares them
    def prepare(self) -> None:
        """Fuse the q/k/v and gate/up projections, store every projection transposed and pack it for
        the CPU's GEMM library (speclab.models.packed_linear). Runs before the first forward, and
        again after the weights were moved or converted (`.to()`); an in-place change repacks the
        weight it touched. On a CPU every fused weight goes into one huge-page arena (speclab.models.
        huge_pages: a decode step's stream of weights reads faster from 2 MB pages)."""
        table = self.lm_head if self.lm_head.weight is not self.model.embed_tokens.weight else self.model.embed_tokens
        weights = [m.weight for layer in self.model.layers for m in (*layer.self_attn.children(), *layer.mlp.children())
                   if isinstance(m, nn.Linear)] + [table.weight]
        arena = huge_pages.arena_for(weights) if table.weight.device.type == "cpu" else None
        del weights  # each layer's old weights are freed as it moves (this list held them all until the end)
        for layer in self.model.layers:
            layer.self_attn.prepare(arena)
            layer.mlp.prepare(arena)
            if arena is not None:  # the layer's weights just left the heap: its pages go back now, so
                huge_pages.release_freed_heap()  # that the arena and the old weights never add up
        if table is self.model.embed_tokens:  # tied: one (transposed) table for both
            fuse(self.model.embed_tokens, arena=arena)
            self.lm_head.weight = self.model.embed_tokens.weight
        else:
            fuse(self.lm_head, arena=arena)
        self.head = PackedLinear(self.lm_head.weight)
        if arena is not None:
            huge_pages.release_freed_heap()
        self.decoder_plan, self.decoder_why = plan_decoder_layers(self.model.layers, self.config)
        self._prepared = True

    def _apply(self, fn, recurse=True):  # .to(), .float(), ... give new tensors: fuse and pack again
        self._prepared = False
        return super()._apply(fn, recurse)

    @torch.inference_mode()
    def forward(self, input_ids, meta: AttentionMetadata, kv_caches, hidden_layers=()):
        """Run the flattened batch.

        Args:
            input_ids: (N,) tokens of all scheduled requests, concatenated.
            kv_caches: one (k_cache, v_cache) pair per layer.
            hidden_layers: indices of layers whose outputs to return too (0 = embeddings,
                i = after layer i), for draft heads that read the target's hidden states.
        Returns:
            hidden (N, D) after the final norm, and a list of the requested hidden states.
        """
        if not self._prepared:
            self.prepare()
        x = self.model.embed_tokens(input_ids)
        if self.decoder_plan is not None and self.decoder_plan.usable(x, kv_caches):  # one native call (cpu_decoder)
            return self._forward_native(x, meta, kv_caches, hidden_layers)
        saved = [x] if 0 in hidden_layers else []
        for i, layer in enumerate(self.model.layers, start=1):
            x = layer(x, meta, *kv_caches[i - 1])
            if i in hidden_layers:
                saved.append(x)
        return self.model.norm(x), saved

    def _forward_native(self, x, meta, kv_caches, hidden_layers):
        """`forward`'s loop as cpu_decoder calls over x in place, stopping at each layer to save."""
        L = len(self.model.layers)
        saved = [x.clone()] if 0 in hidden_layers else []
        start = 0
        for stop in sorted({i for i in hidden_layers if 0 < i < L} | {L}):
            self.decoder_plan.run(x, meta, kv_caches, start, stop)
            if stop in hidden_layers:
                saved.append(x.clone())
            start = stop
        return self.model.norm(x), saved

    @torch.inference_mode()
    def compute_logits(self, hidden):  # (M, D) -> (M, V) float32 whatever the weights' dtype
        if not self._prepared:
            self.prepare()
        return self.head(hidden).float()

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype=None, device=None):
        """One (k, v) pair of (num_blocks, block_size, Hkv, Dh) tensors per layer."""
        cfg = self.config
        dtype = dtype or self.lm_head.weight.dtype
        device = device or self.lm_head.weight.device
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        return [(kv_zeros(shape, dtype, device), kv_zeros(shape, dtype, device)) for _ in range(cfg.num_hidden_layers)]

    def kv_bytes_per_token(self) -> int:
        cfg = self.config
        return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * self.lm_head.weight.element_size()


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}


def read_safetensors(path) -> dict[str, torch.Tensor]:
    """A .safetensors file's tensors, each read into memory of its own (the format: an 8-byte little-endian
    header length, a JSON header of name -> dtype, shape and byte range, then the data). safetensors'
    `load_file` maps the file instead and hands out tensors that share the mapping: it stays resident until
    the last of them is freed, so a model whose norms keep theirs holds the whole file beside its weights."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in SAFETENSORS_DTYPES:
                raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, which speclab does not load")
            start, end = info["data_offsets"]
            t = torch.empty(info["shape"], dtype=SAFETENSORS_DTYPES[info["dtype"]])
            raw = t.view(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
            if raw.numel() != end - start:
                raise ValueError(f"{path}: tensor {name} holds {end - start} bytes, its shape and dtype {raw.numel()}")
            f.seek(8 + n + start)
            if f.readinto(memoryview(raw.numpy())) != raw.numel():
                raise ValueError(f"{path} ends inside tensor {name}: the file is truncated")
            out[name] = t
    return out


@contextmanager
def uninitialised():
    """Linear and Embedding modules built inside keep torch.empty's weights, with no page written: for a model
    whose every weight a checkpoint's is about to replace (transformers' `no_init_weights` does the same). A
    model built on the meta device would do it too, but its first use imported 900 more modules (150 MB). It
    patches the two classes while the model is built, so a Linear built meanwhile in another thread would keep
    its uninitialised weights too: load models from one thread (the engine, the server and the lessons do)."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved


def load_llama(path, dtype=torch.float32, device="cpu") -> LlamaForCausalLM:
    """Load a Hugging Face Llama checkpoint directory (config.json + *.safetensors) into speclab's forward."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} has no config.json: pass a Hugging Face Llama checkpoint directory")
    cfg = LlamaConfig.from_hf(json.loads((path / "config.json").read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no .safetensors weights")
    state = {}
    for f in files:
        state.update(read_safetensors(f))
    # The checkpoint's tensors become the parameters (assign=True): a model built uninitialised holds no
    # weights of its own, and prepare() moves them into their fused home layer by layer, handing each layer's
    # old pages back. Loading SmolLM2 in float32 peaks near one copy of its 540 MB (1.0 GB resident with torch),
    # where a model built with initialised weights, loaded into from the mapped file and then prepared had held
    # three at once (1.8 GB; 2026-12-07, a 2-core Zen 4).
    with uninitialised():
        model = LlamaForCausalLM(cfg)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    del state
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match a Llama model (missing {missing[:4]}, unexpected {unexpected[:4]})")
    if cfg.tie_word_embeddings:  # assigning replaced the embedding's parameter: the head shares the new one
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(dtype=dtype, device=device).eval()
    model.prepare()
    return model
